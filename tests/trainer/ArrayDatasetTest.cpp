// The safetensors and npy formats against numpy/PyTorch (tests/trainer/make_array_files.py):
// several shards, every dtype the wire carries, several model inputs by name; a two-input model
// trained by the in-memory pipeline gets exactly the losses the unsplit model gives on the same
// samples; broken shards.
#include <gtest/gtest.h>

#include "tests/trainer/DatasetTestSupport.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "trainer/Dataset.h"

namespace cairn {
namespace {

using testing::datasetFixture;
using testing::expectBadInputNaming;
using testing::idsOf;
using testing::readReference;

DataOptions arrays(const std::string& format, const std::string& location,
                   std::vector<std::string> inputs, const std::string& targets) {
  DataOptions o;
  o.format = format;
  o.location = location;
  o.inputs = std::move(inputs);
  o.targets = targets;
  return o;
}

TEST(ArrayDataset, SafetensorsShardsMatchNumpy) {
  const std::string dir = datasetFixture("make_array_files.py");
  auto ref = readReference(dir + "/st_ref.safetensors");
  DatasetPair d = loadDatasets(arrays("safetensors", dir + "/st",
                                      {"input_ids", "attention_mask", "pixels", "emb"}, "labels"),
                               0);
  EXPECT_EQ(d.train->size(), 7 + 5 + 9);
  EXPECT_EQ(d.train->inputCount(), 4);
  ASSERT_EQ(d.train->shards().size(), 3u);
  EXPECT_EQ(d.train->shards()[1].samples, 5);
  Batch b = d.train->get(idsOf(ref["ids"]), false);
  ASSERT_EQ(b.extra_inputs.size(), 3u);
  const std::vector<torch::Tensor> got = {b.inputs, b.extra_inputs[0], b.extra_inputs[1],
                                          b.extra_inputs[2], b.targets};
  const char* names[] = {"input_ids", "attention_mask", "pixels", "emb", "labels"};
  for (size_t n = 0; n < got.size(); ++n) {
    EXPECT_EQ(got[n].scalar_type(), ref[names[n]].scalar_type()) << names[n];
    EXPECT_TRUE(got[n].equal(ref[names[n]])) << names[n];
  }
  EXPECT_EQ(b.extra_inputs[2].scalar_type(), torch::kBFloat16);
  EXPECT_EQ(b.modelInputs().size(), 4u);
}

TEST(ArrayDataset, NpyShardFoldersMatchNumpy) {
  const std::string dir = datasetFixture("make_array_files.py");
  auto ref = readReference(dir + "/npy_ref.safetensors");
  for (const std::string& location : {dir + "/npy", dir + "/npy/s*"}) {
    DatasetPair d =
        loadDatasets(arrays("npy", location, {"input_ids", "attention_mask", "x"}, "labels"), 0);
    EXPECT_EQ(d.train->size(), 10);
    ASSERT_EQ(d.train->shards().size(), 2u);
    EXPECT_EQ(d.train->shards()[0].path, dir + "/npy/s0");
    Batch b = d.train->get(idsOf(ref["ids"]), false);
    EXPECT_TRUE(b.inputs.equal(ref["input_ids"]));
    EXPECT_EQ(b.inputs.scalar_type(), torch::kInt);
    EXPECT_TRUE(b.extra_inputs.at(0).equal(ref["attention_mask"]));
    EXPECT_TRUE(b.extra_inputs.at(1).equal(ref["x"]));
    EXPECT_EQ(b.extra_inputs.at(1).scalar_type(), torch::kDouble);
    EXPECT_TRUE(b.targets.equal(ref["labels"]));
  }
  // One folder of inputs.npy and targets.npy is one shard, with the default names.
  DataOptions plain;
  plain.format = "npy";
  plain.location = dir + "/plain";
  plain.test_location = dir + "/plain";
  plain.train_samples = 6;
  DatasetPair p = loadDatasets(plain, 0);
  EXPECT_EQ(p.train->size(), 6);
  EXPECT_EQ(p.test->size(), 10);
  EXPECT_EQ(p.train->get({5, 1}, false).targets[0].item<int64_t>(), 5);
}

TEST(ArrayDataset, BrokenShardsNameTheFile) {
  const std::string bad = datasetFixture("make_array_files.py") + "/bad";
  auto npy = [&](const std::string& sub) {
    return arrays("npy", bad + "/" + sub, {"inputs"}, "targets");
  };
  expectBadInputNaming([&] { loadDatasets(npy("uint16"), 0); }, bad + "/uint16/inputs.npy", "<u2");
  expectBadInputNaming([&] { loadDatasets(npy("mismatch"), 0); }, bad + "/mismatch/s1",
                       "per-sample shape");
  expectBadInputNaming([&] { loadDatasets(npy("fortran"), 0); }, bad + "/fortran/inputs.npy",
                       "Fortran");
  expectBadInputNaming([&] { loadDatasets(npy("count"), 0); }, bad + "/count", "5 samples");
  DataOptions labels = npy("count");
  labels.targets = "labels";
  expectBadInputNaming([&] { loadDatasets(labels, 0); }, bad + "/count", "labels.npy");
  expectBadInputNaming(
      [&] {
        loadDatasets(arrays("safetensors", bad + "/no_targets.safetensors", {"inputs"}, "targets"),
                     0);
      },
      bad + "/no_targets.safetensors", "\"targets\"");
  expectBadInputNaming(
      [&] {
        loadDatasets(arrays("safetensors", bad + "/int16.safetensors", {"inputs"}, "targets"), 0);
      },
      bad + "/int16.safetensors", "wire");
}

// data.inputs feeds the Root stage's two inputs in order: with lr 0 the weights stay put, so the
// loss of every step is the unsplit model's cross entropy on that step's samples (read from a copy
// numpy made of the same shards).
TEST(ArrayDataset, TwoModelInputsReachTheRootInOrder) {
  const std::string dir = datasetFixture("make_array_files.py");
  testing::PipelineRun run =
      testing::runInMemoryPipeline(dir + "/twoin/node_data", [](TrainOptions&) {});
  ASSERT_EQ(run.losses.size(), 3u);
  ASSERT_EQ(run.batches.size(), 3u);
  auto all = readReference(dir + "/twoin_data.safetensors");
  torch::jit::Module full = torch::jit::load(dir + "/twoin/full.pt");
  full.eval();
  for (size_t s = 0; s < 3; ++s) {
    torch::Tensor ids = torch::tensor(run.batches[s], torch::kLong);
    torch::Tensor logits = full.forward({all["input_ids"].index_select(0, ids),
                                         all["attention_mask"].index_select(0, ids)})
                               .toTensor();
    torch::Tensor labels = all["labels"].index_select(0, ids).unsqueeze(1);
    const double expected = -torch::log_softmax(logits, 1).gather(1, labels).mean().item<double>();
    EXPECT_NEAR(run.losses[s], expected, 1e-5) << "step " << s;
  }
  // A Root stage that takes two inputs cannot be fed one (the Root alone: it fails before it
  // would talk to anyone).
  const std::string node_data = dir + "/twoin/node_data";
  const JobSpec job = readJobSpec(jobSpecPath(node_data));
  StageTrainerConfig config;
  config.node = readNodeSpec(nodeSpecPath(node_data, "node_0"));
  config.options = parseTrainOptions(job.training, jobSpecPath(node_data));
  config.data = parseDataOptions(job.data, jobSpecPath(node_data));
  config.data.inputs = {"input_ids"};
  config.show_progress = false;
  testing::InMemoryHub hub(2);
  testing::InMemoryLink link(hub, 0);
  StageTrainer root(config, torch::jit::load(nodeDirectory(node_data, "node_0") + "/stage.pt"),
                    link, TrainerObserver{});
  expectBadInputNaming([&] { root.run(); }, "Root stage node_0", "takes 2");
}

}  // namespace
}  // namespace cairn
