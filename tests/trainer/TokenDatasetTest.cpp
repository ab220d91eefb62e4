// The tokens format against numpy: llm.c shards (uint16 and uint32), 1-D .npy files, headerless
// uint16 and bytes, read by tests/trainer/make_token_files.py with numpy.memmap / numpy.load and
// compared sample by sample; shards as chunks; broken files.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/trainer/DatasetTestSupport.h"
#include "tests/trainer/TokenFixture.h"
#include "trainer/Dataset.h"
#include "trainer/Sampler.h"

namespace cairn {
namespace {

using testing::expectBadInputNaming;
using testing::idsOf;
using testing::readReference;
using testing::tokenFiles;
using testing::tokens;

// Every reference sample of `ref` equals cairn's, and the shards are the files numpy read.
void expectMatchesNumpy(const Dataset& d, const std::string& ref_path) {
  auto ref = readReference(ref_path);
  const std::vector<int64_t> ids = idsOf(ref["ids"]);
  Batch b = d.get(ids, /*training=*/false);
  EXPECT_EQ(b.inputs.scalar_type(), torch::kLong);
  EXPECT_TRUE(b.inputs.equal(ref["inputs"])) << ref_path;
  EXPECT_TRUE(b.targets.equal(ref["targets"])) << ref_path;
  const std::vector<ShardInfo> shards = d.shards();
  const std::vector<int64_t> samples = idsOf(ref["shard_samples"]);
  ASSERT_EQ(shards.size(), samples.size());
  int64_t total = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    EXPECT_EQ(shards[k].samples, samples[k]) << shards[k].path;
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08llx",
                  static_cast<unsigned long long>(ref["crc32"][int64_t(k)].item<int64_t>()));
    EXPECT_EQ(shardChecksum(shards[k]), std::string("crc32:") + crc) << shards[k].path;
    total += samples[k];
  }
  EXPECT_EQ(d.size(), total);
}

TEST(TokenDataset, LlmcShardsMatchNumpy) {
  const std::string dir = tokenFiles();
  DataOptions o = tokens(dir + "/llmc/train_*.bin");
  o.test_location = dir + "/llmc/val_*.bin";
  DatasetPair d = loadDatasets(o, 0);
  expectMatchesNumpy(*d.train, dir + "/llmc_ref.safetensors");
  ASSERT_TRUE(d.test);
  expectMatchesNumpy(*d.test, dir + "/llmc_val_ref.safetensors");
}

TEST(TokenDataset, Llama3ShardsNpyAndHeaderlessMatchNumpy) {
  const std::string dir = tokenFiles();
  expectMatchesNumpy(*loadDatasets(tokens(dir + "/llama"), 0).train,
                     dir + "/llama_ref.safetensors");
  expectMatchesNumpy(*loadDatasets(tokens(dir + "/npy"), 0).train, dir + "/npy_ref.safetensors");
  DataOptions raw = tokens(dir + "/raw16.bin");
  raw.token_dtype = "uint16";
  expectMatchesNumpy(*loadDatasets(raw, 0).train, dir + "/raw16_ref.safetensors");
  // The same file read as bytes is twice as long (a byte file has a vocabulary of 256).
  EXPECT_EQ(loadDatasets(tokens(dir + "/raw16.bin"), 0).train->size(), (2 * 1234 - 1) / 16);
}

TEST(TokenDataset, TestFractionSplitsAcrossShards) {
  const std::string dir = tokenFiles();
  auto ref = readReference(dir + "/llmc_ref.safetensors");
  DataOptions o = tokens(dir + "/llmc/train_*.bin");
  o.test_fraction = 0.25;  // 203 samples: the last 50 (all in the third file) are the test set
  DatasetPair d = loadDatasets(o, 0);
  ASSERT_EQ(d.train->size() + d.test->size(), 62 + 48 + 93);
  EXPECT_EQ(d.test->size(), 50);
  EXPECT_EQ(d.train->shards().back().samples, 93 - 50);
  // Test sample 0 is overall sample 153; the reference holds it (ids step by 11 from 5).
  const std::vector<int64_t> ids = idsOf(ref["ids"]);
  const auto at = std::find(ids.begin(), ids.end(), 159) - ids.begin();
  ASSERT_LT(size_t(at), ids.size());
  EXPECT_TRUE(d.test->get({159 - 153}, false).inputs[0].equal(ref["inputs"][at]));
  o.train_samples = 70;
  EXPECT_EQ(loadDatasets(o, 0).train->size(), 70);
  EXPECT_EQ(loadDatasets(o, 0).train->shards().size(), 2u);
}

TEST(TokenDataset, EachShardIsAChunk) {
  const std::string dir = tokenFiles();
  DataOptions o = tokens(dir + "/llmc/train_*.bin");
  DatasetPair d = loadDatasets(o, 0);
  EXPECT_EQ(chunkSizes(*d.train, o, 2), (std::vector<int64_t>{62, 48, 93}));
  // Two clusters: cluster 0 gets chunks 0 and 2, cluster 1 chunk 1 (round robin).
  ShardSampler c0(chunkSizes(*d.train, o, 2), 0, 2, {}, 1),
      c1(chunkSizes(*d.train, o, 2), 1, 2, {}, 1);
  EXPECT_EQ(c0.shard().size(), 62u + 93u);
  EXPECT_EQ(c1.shard().front(), 62);
  EXPECT_EQ(c1.shard().back(), 62 + 48 - 1);
  o.chunks = 2;
  expectBadInputNaming([&] { chunkSizes(*d.train, o, 2); }, "data.chunks", "3 shards");
  // One file: cut into equal chunks as before.
  DataOptions one = tokens(dir + "/raw16.bin");
  one.chunks = 4;
  EXPECT_EQ(chunkSizes(*loadDatasets(one, 0).train, one, 2).size(), 4u);
}

TEST(TokenDataset, BrokenFilesNameTheFile) {
  const std::string bad = tokenFiles() + "/bad";
  for (const char* name :
       {"short.bin", "version.bin", "fortran.npy", "complex.npy", "bigendian.npy", "truncated.npy",
        "extra_key.npy", "float.npy", "matrix.npy"})
    expectBadInputNaming([&] { loadDatasets(tokens(bad + "/" + name), 0); }, bad + "/" + name);
  DataOptions odd = tokens(bad + "/odd.bin");
  odd.token_dtype = "uint16";
  expectBadInputNaming([&] { loadDatasets(odd, 0); }, bad + "/odd.bin", "uint16");
  expectBadInputNaming([&] { loadDatasets(tokens(bad + "/nothing_*.bin"), 0); }, "nothing_*.bin",
                       "matches no file");
  expectBadInputNaming([&] { loadDatasets(tokens(bad + "/missing.bin"), 0); }, "missing.bin");
}

}  // namespace
}  // namespace cairn
