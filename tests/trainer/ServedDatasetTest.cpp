// ServedDataset (trainer/data/ServedDataset.h): a Root's training set whose shards the coordinator
// serves. Against numpy's reading of the same llm.c token shards (make_token_files.py): the served
// dataset gives the same samples for the same ids, in the ids' order, opening a chunk only when a
// sample of it is read (the chunk source is asked for nothing else); a chunk whose file holds
// another sample count than the table is refused naming the chunk; firstNeedOrder. The test set
// (data.test_shards, chunk ids after the training chunks') gives numpy's test samples too.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "tests/trainer/DatasetTestSupport.h"
#include "tests/trainer/TokenFixture.h"
#include "trainer/data/ServedDataset.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using testing::idsOf;
using testing::readReference;
using testing::tokenFiles;
using testing::tokens;

// Serves chunk k as a copy of the k-th local shard (training shards, then test shards) under
// another name, counting what is asked.
struct CopyingSource : ChunkSource {
  std::vector<ShardInfo> shards;
  std::string dir;
  std::vector<int64_t> asked;
  void start(const std::vector<ServedShard>&, uint64_t) override {}
  void add(const std::vector<ServedShard>&) override {}
  std::string ready(int64_t chunk) override {
    asked.push_back(chunk);
    const std::string to = dir + "/cached_" + std::to_string(chunk);
    fs::copy_file(shards.at(size_t(chunk)).path, to, fs::copy_options::overwrite_existing);
    return to;
  }
};

std::vector<ServedShard> tableOf(const std::vector<ShardInfo>& shards, int64_t first) {
  std::vector<ServedShard> table;
  for (size_t k = 0; k < shards.size(); ++k)
    table.push_back({first + int64_t(k), fs::path(shards[k].path).filename().string(), shards[k].bytes,
                     shards[k].samples, shardChecksum(shards[k])});
  return table;
}

struct Served {
  std::string fixture = tokenFiles();
  DatasetPair local = loadDatasets(tokens(fixture + "/llmc/train_*.bin"), 0);
  CopyingSource source;
  std::vector<ServedShard> table;
  Served() {
    source.shards = local.train->shards();
    source.dir = ::testing::TempDir() + "/cairn_served_" + std::to_string(::getpid());
    fs::create_directories(source.dir);
    table = tableOf(source.shards, 0);
  }
  ~Served() { fs::remove_all(source.dir); }
};

TEST(ServedDataset, GivesNumpysSamplesInTheIdsOrderOpeningOnlyTheChunksRead) {
  Served s;
  ASSERT_EQ(s.table.size(), 3u);  // 62, 48 and 93 samples
  ServedDataset served(tokens("unused"), s.table, s.source);
  EXPECT_EQ(served.size(), s.local.train->size());
  // Only chunk 2's samples: the source is asked for chunk 2 alone, once.
  const Batch only2 = served.get({200, 110, 150}, true);
  EXPECT_EQ(s.source.asked, std::vector<int64_t>({2}));
  EXPECT_TRUE(only2.inputs.equal(s.local.train->get({200, 110, 150}, true).inputs));
  // numpy's reading of every sample, asked in a shuffled order that mixes the chunks.
  auto ref = readReference(s.fixture + "/llmc_ref.safetensors");
  std::vector<int64_t> ids = idsOf(ref["ids"]);
  std::vector<int64_t> rows(ids.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = int64_t((i * 37) % rows.size());
  ASSERT_EQ(std::set<int64_t>(rows.begin(), rows.end()).size(), rows.size());
  std::vector<int64_t> shuffled;
  for (int64_t r : rows) shuffled.push_back(ids[size_t(r)]);
  const torch::Tensor index = torch::tensor(rows, torch::kLong);
  const Batch b = served.get(shuffled, true);
  EXPECT_EQ(b.inputs.scalar_type(), torch::kLong);
  EXPECT_TRUE(b.inputs.equal(ref["inputs"].index_select(0, index)));
  EXPECT_TRUE(b.targets.equal(ref["targets"].index_select(0, index)));
  EXPECT_EQ(s.source.asked, std::vector<int64_t>({2, 0, 1})) << "each chunk opened once";
  const std::vector<ShardInfo> shards = served.shards();
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[1].samples, 48);
  EXPECT_EQ(shards[1].path, s.table[1].file);
}

TEST(ServedDataset, AChunkHoldingAnotherSampleCountThanTheTableIsRefusedNamingIt) {
  Served s;
  s.table[1].samples = 50;  // the file holds 48
  ServedDataset served(tokens("unused"), s.table, s.source);
  try {
    served.get({70}, true);
    FAIL() << "accepted";
  } catch (const BadInput& e) {
    EXPECT_EQ(std::string(e.what()), "served data: chunk 1 (" + s.table[1].file +
                                         ") holds 48 samples, the chunk table (data.shards) says 50");
  }
  DataOptions npy = tokens("unused");
  npy.format = "npy";
  EXPECT_THROW(ServedDataset(npy, s.table, s.source), BadInput);
  s.table[2].chunk = 5;
  EXPECT_THROW(ServedDataset(tokens("unused"), s.table, s.source), BadInput);
}

TEST(ServedDataset, TheTestTableGivesNumpysTestSamplesFromChunksNumberedAfterTraining) {
  Served s;
  DataOptions with_test = tokens(s.fixture + "/llmc/train_*.bin");
  with_test.test_location = s.fixture + "/llmc/val_*.bin";
  const DatasetPair local = loadDatasets(with_test, 0);
  ASSERT_TRUE(local.test);
  const std::vector<ShardInfo> test_shards = local.test->shards();
  ASSERT_EQ(test_shards.size(), 1u);
  s.source.shards.insert(s.source.shards.end(), test_shards.begin(), test_shards.end());
  const std::vector<ServedShard> test_table = tableOf(test_shards, 3);
  ServedDataset served(tokens("unused"), test_table, s.source, "data.test_shards");
  ASSERT_EQ(served.size(), local.test->size());
  auto ref = readReference(s.fixture + "/llmc_val_ref.safetensors");
  const std::vector<int64_t> ids = idsOf(ref["ids"]);
  const Batch b = served.get(ids, false);
  EXPECT_TRUE(b.inputs.equal(ref["inputs"]));
  EXPECT_TRUE(b.targets.equal(ref["targets"]));
  EXPECT_EQ(s.source.asked, std::vector<int64_t>({3})) << "the test chunk, by its own id";
  std::vector<ServedShard> bad = test_table;
  bad[0].samples += 1;
  try {
    ServedDataset(tokens("unused"), bad, s.source, "data.test_shards").get({0}, false);
    FAIL() << "accepted";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 3 (val_000.bin) holds"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(data.test_shards)"), std::string::npos) << e.what();
  }
}

TEST(ServedDataset, FirstNeedOrderIsTheOrderTheIdsFirstTouchTheChunks) {
  const std::vector<ServedShard> table = {{0, "a", 1, 62, ""}, {1, "b", 1, 48, ""}, {2, "c", 1, 93, ""}};
  EXPECT_EQ(firstNeedOrder(table, {100, 5, 70, 3, 61}), std::vector<int64_t>({1, 0}));
  EXPECT_EQ(firstNeedOrder(table, {202, 62, 0, 110}), std::vector<int64_t>({2, 1, 0}));
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

DataOptions parsed(const nlohmann::json& data) {
  DataSpec spec;
  spec.location = "/srv/tokens";
  spec.format = data.value("format", "tokens");
  spec.options = data;
  spec.options.erase("format");
  return parseDataOptions(spec, "job.json");
}

void expectRefused(const nlohmann::json& data, const std::string& part) {
  try {
    parsed(data);
    ADD_FAILURE() << "accepted " << data.dump();
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ServedDataOptions, TheChunkTableAndCacheAreReadAndEveryBadValueIsNamed) {
  const nlohmann::json row = {{"chunk", 0}, {"file", "a.bin"}, {"bytes", 100}, {"samples", 5},
                              {"crc32", "crc32:0123abcd"}};
  nlohmann::json row1 = row;
  row1["chunk"] = 1;
  const DataOptions d = parsed({{"source", "coordinator"}, {"cache_mb", 64}, {"test_fraction", 0},
                                {"shards", {row, row1}}});
  EXPECT_EQ(d.source, "coordinator");
  EXPECT_EQ(d.cache_mb, 64);
  ASSERT_EQ(d.shards.size(), 2u);
  EXPECT_EQ(d.shards[1].chunk, 1);
  EXPECT_EQ(d.shards[1].file, "a.bin");
  EXPECT_EQ(d.shards[1].bytes, 100u);
  EXPECT_EQ(d.shards[1].samples, 5);
  EXPECT_EQ(d.shards[1].crc32, "crc32:0123abcd");
  EXPECT_EQ(parsed(nlohmann::json::object()).source, "local");
  expectRefused({{"source", "nfs"}}, "data.source");
  expectRefused({{"cache_mb", 5}}, "applies only with data.source \"coordinator\"");
  expectRefused({{"source", "coordinator"}, {"format", "npy"}}, "serves the tokens and safetensors formats only");
  EXPECT_EQ(parsed({{"source", "coordinator"}, {"test_location", "/x"}}).test_location, "/x")
      << "a test set on the coordinator's machine";
  nlohmann::json bad = row1;
  expectRefused({{"source", "coordinator"}, {"shards", {bad}}}, "data.shards[0].chunk must be 0");
  bad = row;
  bad["file"] = "../etc/passwd";
  expectRefused({{"source", "coordinator"}, {"shards", {bad}}}, "data.shards[0].file must be a file name");
  bad = row;
  bad["crc32"] = "crc32:XYZ";
  expectRefused({{"source", "coordinator"}, {"shards", {bad}}}, "data.shards[0].crc32 must be");
  bad = row;
  bad["samples"] = 0;
  expectRefused({{"source", "coordinator"}, {"shards", {bad}}}, "data.shards[0].samples must be a positive integer");
  bad = row;
  bad["extra"] = 1;
  expectRefused({{"source", "coordinator"}, {"shards", {bad}}}, "unknown key \"extra\"");
}

TEST(ServedDataOptions, TheTestChunkTableIsReadNumberedAfterTheTrainingChunks) {
  auto row = [](int64_t chunk, const std::string& file) {
    return nlohmann::json{{"chunk", chunk}, {"file", file}, {"bytes", 100}, {"samples", 5},
                          {"crc32", "crc32:0123abcd"}};
  };
  const nlohmann::json base = {{"source", "coordinator"}, {"test_location", "/srv/val_*.bin"},
                               {"shards", {row(0, "a.bin"), row(1, "b.bin")}}};
  nlohmann::json data = base;
  data["test_shards"] = {row(2, "val_0.bin"), row(3, "val_1.bin")};
  const DataOptions d = parsed(data);
  ASSERT_EQ(d.test_shards.size(), 2u);
  EXPECT_EQ(d.test_shards[0].chunk, 2);
  EXPECT_EQ(d.test_shards[1].chunk, 3);
  EXPECT_EQ(d.test_shards[1].file, "val_1.bin");
  EXPECT_EQ(d.test_location, "/srv/val_*.bin");
  EXPECT_TRUE(parsed(base).test_shards.empty());

  data["test_shards"] = {row(0, "val_0.bin")};
  expectRefused(data, "data.test_shards[0].chunk must be 2 (rows in chunk order, numbered after the 2 training chunks)");
  data["test_shards"] = {row(2, "../val_0.bin")};
  expectRefused(data, "data.test_shards[0].file must be a file name");
  nlohmann::json r = row(2, "v.bin");
  r["crc32"] = 7;
  data["test_shards"] = {r};
  expectRefused(data, "data.test_shards[0].crc32 must be");
  data["test_shards"] = "val";
  expectRefused(data, "data.test_shards must be a list of chunk table rows");
  nlohmann::json no_location = base;
  no_location.erase("test_location");
  no_location["test_shards"] = {row(2, "v.bin")};
  expectRefused(no_location, "data.test_shards is the table of data.test_location's chunks");
  nlohmann::json no_shards = base;
  no_shards.erase("shards");
  no_shards["test_shards"] = {row(0, "v.bin")};
  expectRefused(no_shards, "data.test_shards needs data.shards");
  expectRefused({{"test_shards", {row(0, "v.bin")}}, {"test_location", "/x"}},
                "data.test_shards applies only with data.source \"coordinator\"");
}

}  // namespace
}  // namespace cairn
