// Unit tests of the trainer's parts against independent references (ATen's own losses, known
// files, closed-form schedules).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "core/Error.h"
#include "core/OpCount.h"
#include "trainer/Dataset.h"
#include "trainer/Loss.h"
#include "trainer/LrSchedule.h"
#include "trainer/Sampler.h"
#include "trainer/StageExecutor.h"
#include "trainer/TrainOptions.h"
#include "trainer/data/ImageTransforms.h"

namespace cairn {
namespace {

TEST(Loss, MicrobatchSharesAddUpToTheBatchMean) {
  torch::manual_seed(1);
  torch::Tensor logits = torch::randn({12, 6, 9});
  torch::Tensor targets = torch::randint(0, 9, {12, 6}, torch::kLong);
  targets.index_put_({torch::randint(0, 2, {12, 6}, torch::kLong).to(torch::kBool)}, -100);
  LossOptions o;
  const double denominator = double(lossTermCount(o, targets));
  double total = 0;
  for (int64_t start : {0, 5, 9}) {
    const int64_t len = start == 0 ? 5 : start == 5 ? 4 : 3;
    total +=
        microbatchLoss(o, logits.narrow(0, start, len), targets.narrow(0, start, len), denominator)
            .item<double>();
  }
  const double reference =
      at::cross_entropy_loss(logits.reshape({-1, 9}), targets.reshape({-1})).item<double>();
  EXPECT_NEAR(total, reference, 1e-5);

  LossOptions mse;
  mse.kind = LossKind::kMse;
  torch::Tensor a = torch::randn({8, 3}), b = torch::randn({8, 3});
  const double d = double(lossTermCount(mse, b));
  const double split = microbatchLoss(mse, a.narrow(0, 0, 3), b.narrow(0, 0, 3), d).item<double>() +
                       microbatchLoss(mse, a.narrow(0, 3, 5), b.narrow(0, 3, 5), d).item<double>();
  EXPECT_NEAR(split, at::mse_loss(a, b).item<double>(), 1e-6);

  LossOptions nll;
  nll.kind = LossKind::kNll;
  torch::Tensor lp = at::log_softmax(torch::randn({10, 4}), 1);
  torch::Tensor t = torch::randint(0, 4, {10}, torch::kLong);
  EXPECT_NEAR(microbatchLoss(nll, lp, t, 10).item<double>(), at::nll_loss(lp, t).item<double>(),
              1e-6);
}

TEST(Loss, EvaluationCountsTopOneHits) {
  torch::Tensor logits = torch::tensor({{0.f, 2.f}, {3.f, 1.f}, {0.f, 1.f}});
  torch::Tensor targets = torch::tensor({1, 1, 1}, torch::kLong);
  EvalTally t = evaluationTally(LossOptions{}, logits, targets);
  EXPECT_EQ(t.correct, 2);
  EXPECT_EQ(t.terms, 3);
}

TEST(LrSchedule, ClosedForms) {
  LrScheduleOptions o;
  EXPECT_DOUBLE_EQ(LrSchedule(0.1, o, 100).at(57), 0.1);
  o.kind = LrScheduleKind::kStep;
  o.step_size = 10;
  o.gamma = 0.5;
  EXPECT_DOUBLE_EQ(LrSchedule(0.1, o, 100).at(9), 0.1);
  EXPECT_DOUBLE_EQ(LrSchedule(0.1, o, 100).at(25), 0.025);
  o.kind = LrScheduleKind::kCosine;
  o.min_lr = 0.01;
  EXPECT_DOUBLE_EQ(LrSchedule(0.1, o, 100).at(0), 0.1);
  EXPECT_NEAR(LrSchedule(0.1, o, 100).at(50), 0.055, 1e-12);
  EXPECT_NEAR(LrSchedule(0.1, o, 100).at(100), 0.01, 1e-12);
  o.kind = LrScheduleKind::kWarmupCosine;
  o.warmup_steps = 10;
  EXPECT_NEAR(LrSchedule(0.1, o, 110).at(0), 0.01, 1e-12);
  EXPECT_NEAR(LrSchedule(0.1, o, 110).at(9), 0.1, 1e-12);
  EXPECT_NEAR(LrSchedule(0.1, o, 110).at(10), 0.1, 1e-12);
  EXPECT_NEAR(LrSchedule(0.1, o, 110).at(60), 0.055, 1e-12);
}

TEST(ShardSampler, ShardsAreDisjointAndCoverTheData) {
  std::set<int64_t> seen;
  for (int c = 0; c < 3; ++c) {
    ShardSampler s(1000, c, 3, 0, {}, 42);
    for (int64_t id : s.shard()) EXPECT_TRUE(seen.insert(id).second) << id << " in two shards";
  }
  EXPECT_EQ(seen.size(), 1000u);
  // chunk list: chunks 1 and 3 of 4, dealt to 2 clusters.
  ShardSampler a(400, 0, 2, 4, {1, 3}, 0), b(400, 1, 2, 4, {1, 3}, 0);
  EXPECT_EQ(a.shard().front(), 100);
  EXPECT_EQ(a.shard().back(), 199);
  EXPECT_EQ(b.shard().front(), 300);
  EXPECT_THROW(ShardSampler(400, 0, 3, 4, {1, 3}, 0), BadInput);
}

TEST(ShardSampler, EpochOrderIsASeededPermutation) {
  ShardSampler s(500, 0, 1, 0, {}, 7);
  auto e0 = s.epochOrder(0), e1 = s.epochOrder(1);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, ShardSampler(500, 0, 1, 0, {}, 7).epochOrder(0));
  EXPECT_NE(e0, ShardSampler(500, 0, 1, 0, {}, 8).epochOrder(0));
  std::sort(e0.begin(), e0.end());
  for (int64_t i = 0; i < 500; ++i) EXPECT_EQ(e0[size_t(i)], i);
}

TEST(Dataset, FashionMnistIdxGzipAndRaw) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(dir + "/train-labels-idx1-ubyte.gz").good())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  DataOptions o;
  o.location = dir;
  o.format = "idx";
  o.test_samples = 100;
  DatasetPair d = loadDatasets(o, 0);
  EXPECT_EQ(d.train->size(), 60000);
  EXPECT_EQ(d.test->size(), 100);
  // Published facts of Fashion-MNIST: the first training label is 9 (ankle boot), the first test
  // label is 9, the second training label is 0 (T-shirt/top).
  Batch b = d.train->get({0, 1}, false);
  EXPECT_EQ(b.targets[0].item<int64_t>(), 9);
  EXPECT_EQ(b.targets[1].item<int64_t>(), 0);
  EXPECT_EQ(d.test->get({0}, false).targets[0].item<int64_t>(), 9);
  EXPECT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, 1, 28, 28}));
  EXPECT_GE(b.inputs.min().item<float>(), 0.f);
  EXPECT_LE(b.inputs.max().item<float>(), 1.f);
  // The same labels from an uncompressed copy.
  const std::string raw = ::testing::TempDir() + "/cairn_idx_raw";
  std::filesystem::create_directories(raw);
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    auto bytes = readMaybeGzipFile(dir + "/" + f + ".gz");
    std::ofstream(raw + "/" + f, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), int64_t(bytes.size()));
  }
  o.location = raw;
  o.normalize.mean = {0.5};
  o.normalize.std = {0.25};
  DatasetPair r = loadDatasets(o, 0);
  Batch rb = r.train->get({0, 1}, false);
  EXPECT_TRUE(rb.targets.equal(b.targets));
  EXPECT_TRUE(rb.inputs.allclose((b.inputs - 0.5) / 0.25));
}

// An idx batch is transformed at once (IdxDataset, ImageTransforms::applyBatch): bit for bit what
// each image transformed alone gives — by ImageTransforms::apply and, without augmentation, by
// torchvision's arithmetic written out here, (pixel / 255 - mean) / std on the file's own bytes —
// in training and evaluation batches, in any order, with repeats, flipped and cropped or not; in
// a few operators for 128 images (fewer than one per image; two when cropped and flipped).
TEST(Dataset, FashionMnistBatchesEqualEachImageTransformedAlone) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(dir + "/train-images-idx3-ubyte.gz").good())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  DataOptions o;
  o.location = dir;
  o.format = "idx";
  o.train_samples = 2000;
  o.test_samples = 100;
  o.normalize.mean = {0.2860};
  o.normalize.std = {0.3530};
  const DatasetPair d = loadDatasets(o, 5);
  const std::vector<uint8_t> bytes = readMaybeGzipFile(dir + "/train-images-idx3-ubyte.gz");
  const torch::Tensor raw =
      torch::from_blob(const_cast<uint8_t*>(bytes.data()) + 16, {60000, 1, 28, 28}, torch::kUInt8);
  const ImageTransforms alone(o, 1, 5);
  const std::vector<int64_t> ids{1999, 0, 17, 17, 640, 3, 1024, 128};
  std::vector<torch::Tensor> by_apply, by_formula;
  for (int64_t id : ids) {
    by_apply.push_back(alone.apply(raw[id], id, 0, true, "image"));
    by_formula.push_back((raw[id].to(torch::kFloat) / 255.0f - 0.2860f) / 0.3530f);
  }
  for (bool training : {true, false}) {
    const torch::Tensor batch = d.train->get(ids, training).inputs;
    EXPECT_TRUE(batch.equal(torch::stack(by_apply))) << "training " << training;
    EXPECT_TRUE(batch.equal(torch::stack(by_formula))) << "training " << training;
    EXPECT_TRUE(batch.is_contiguous());
  }
  // At once: a batch of 128 dispatches a few operators in all (each image alone took 6 or more).
  const std::string counted = ::testing::TempDir() + "/cairn_idx_ops.json";
  std::vector<int64_t> many(128);
  std::iota(many.begin(), many.end(), int64_t(500));
  {
    OpCount count(counted);
    d.train->get(many, true);
  }
  const auto total = nlohmann::json::parse(std::ifstream(counted))["total"].get<int64_t>();
  EXPECT_GT(total, 0);
  EXPECT_LT(total, 128) << "operators dispatched for one batch of 128 images";
  // Flips, and flips with padded random crops (training) and the centre crop (evaluation): the
  // batch's one gather cuts what apply() cuts image by image, draw after draw.
  o.random_flip = true;
  for (bool crop : {false, true}) {
    if (crop) o.random_crop = RandomCropOptions{{24, 20}, 3};
    const DatasetPair augmented = loadDatasets(o, 5);
    const ImageTransforms each(o, 1, 5);
    for (uint64_t draw : {0, 1}) {
      std::vector<torch::Tensor> drawn;
      for (int64_t id : ids) drawn.push_back(each.apply(raw[id], id, draw, true, "image"));
      const torch::Tensor batch = augmented.train->get(ids, true).inputs;
      EXPECT_TRUE(batch.equal(torch::stack(drawn))) << "crop " << crop << ", draw " << draw;
      EXPECT_TRUE(batch.is_contiguous());
      if (!crop) {
        EXPECT_FALSE(batch.equal(torch::stack(by_apply)));  // some image was flipped
      }
    }
    std::vector<torch::Tensor> evaluated;
    for (int64_t id : ids) evaluated.push_back(each.apply(raw[id], id, 0, false, "image"));
    EXPECT_TRUE(augmented.train->get(ids, false).inputs.equal(torch::stack(evaluated)));
  }
  {
    OpCount count(counted);
    loadDatasets(o, 5).train->get(many, true);  // cropped and flipped
  }
  // ~100 (index tensors, views, the gather), against ~15 per image apart
  EXPECT_LT(nlohmann::json::parse(std::ifstream(counted))["total"].get<int64_t>(), 2 * 128);
}

TEST(Dataset, SafetensorsRoundTripAndTokens) {
  const std::string path = ::testing::TempDir() + "/cairn_data.safetensors";
  torch::Tensor inputs = torch::randn({10, 3}), targets = torch::arange(10, torch::kLong);
  writeSafetensors(path, {{"inputs", inputs}, {"targets", targets}});
  DataOptions o;
  o.location = path;
  o.format = "safetensors";
  DatasetPair d = loadDatasets(o, 0);
  Batch b = d.train->get({7, 2}, false);
  EXPECT_TRUE(b.inputs.equal(torch::stack({inputs[7], inputs[2]})));
  EXPECT_EQ(b.targets[0].item<int64_t>(), 7);

  const std::string text = ::testing::TempDir() + "/cairn_tokens.txt";
  std::ofstream(text) << "abcdefghijklmnopqrstuvwxyz";  // 26 bytes
  DataOptions t;
  t.location = text;
  t.format = "tokens";
  t.block_length = 5;
  t.test_fraction = 0.2;
  DatasetPair tok = loadDatasets(t, 0);
  EXPECT_EQ(tok.train->size(), 4);  // 5 blocks in all, the last one is the test set
  EXPECT_EQ(tok.test->size(), 1);
  Batch tb = tok.train->get({1}, false);
  EXPECT_EQ(tb.inputs[0][0].item<int64_t>(), 'f');
  EXPECT_EQ(tb.targets[0][0].item<int64_t>(), 'g');
  EXPECT_EQ(tb.targets[0][4].item<int64_t>(), 'k');
  EXPECT_EQ(tok.test->get({0}, false).inputs[0][0].item<int64_t>(), 'u');
}

TEST(TrainOptions, SyncModes) {
  EXPECT_EQ(parseTrainOptions(nlohmann::json::object(), "job.json").sync.mode, SyncMode::kAverage);
  EXPECT_EQ(parseTrainOptions({{"sync", "gradients"}}, "job.json").sync.mode, SyncMode::kGradients);
  SyncOptions d = parseTrainOptions({{"sync", "diloco"}}, "job.json").sync;
  EXPECT_EQ(d.mode, SyncMode::kDiLoCo);
  EXPECT_DOUBLE_EQ(d.outer_lr, 0.7);
  EXPECT_DOUBLE_EQ(d.outer_momentum, 0.9);
  EXPECT_TRUE(d.outer_nesterov);
  d = parseTrainOptions({{"sync", {{"name", "diloco"}, {"outer_lr", 0.5}, {"outer_nesterov", false}}}},
                        "job.json")
          .sync;
  EXPECT_DOUBLE_EQ(d.outer_lr, 0.5);
  EXPECT_FALSE(d.outer_nesterov);
  EXPECT_TRUE(d.concurrent_rings);
  EXPECT_FALSE(parseTrainOptions({{"sync", {{"name", "gradients"}, {"concurrent_rings", false}}}},
                                 "job.json")
                   .sync.concurrent_rings);
  EXPECT_TRUE(d.overlap);
  EXPECT_EQ(d.bucket_bytes, int64_t(1) << 20);
  SyncOptions g = parseTrainOptions(
                      {{"sync", {{"name", "gradients"}, {"bucket_bytes", 4096}, {"overlap", false}}}},
                      "job.json")
                      .sync;
  EXPECT_EQ(g.bucket_bytes, 4096);
  EXPECT_FALSE(g.overlap);
  for (const nlohmann::json& bad :
       {nlohmann::json{{"name", "gradients"}, {"bucket_bytes", 0}},
        nlohmann::json{{"name", "average"}, {"overlap", true}}}) {
    try {
      parseTrainOptions({{"sync", bad}}, "job.json");
      FAIL() << bad.dump();
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("training_definition.sync."), std::string::npos)
          << e.what();
    }
  }
  try {
    parseTrainOptions({{"sync", {{"name", "average"}, {"concurrent_rings", "yes"}}}}, "job.json");
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("training_definition.sync.concurrent_rings"),
              std::string::npos)
        << e.what();
  }
  try {
    parseTrainOptions({{"sync", {{"name", "average"}, {"outer_lr", 0.5}}}}, "job.json");
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("training_definition.sync.outer_lr"), std::string::npos)
        << e.what();
  }
}

TEST(TrainOptions, DefaultsAndErrorsNameTheKey) {
  TrainOptions d = parseTrainOptions(nlohmann::json::object(), "job.json");
  EXPECT_EQ(d.batch_size, 64);
  EXPECT_EQ(d.optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(d.optimizer.weight_decay, 0.01);
  auto message = [](const nlohmann::json& j) {
    try {
      parseTrainOptions(j, "job.json");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"optimizer", {{"name", "sgd"}, {"lr", -1}}}}),
            "job.json: training_definition.optimizer.lr must be a non-negative number");
  EXPECT_NE(message({{"batch_sise", 3}}).find("batch_sise"), std::string::npos);
  EXPECT_NE(
      message({{"batch_size", 2}, {"microbatches", 4}}).find("training_definition.microbatches"),
      std::string::npos);
  EXPECT_NE(
      message({{"optimizer", {{"name", "adamw"}, {"momentum", 0.9}}}}).find("optimizer.momentum"),
      std::string::npos);
}

TEST(StageExecutor, NonTensorInputsAndInputGradients) {
  // forward(x: Tensor, k: int, s: float) -> (x * k * s, k + 1)
  torch::jit::Module m("m");
  m.define(R"(
    def forward(self, x: Tensor, k: int, s: float) -> Tuple[Tensor, int]:
        return x * k * s, k + 1
  )");
  std::vector<BoundaryValue> in = {
      {"x", "tensor", "float32", {}}, {"k", "int", "int64", {}}, {"s", "float", "float64", {}}};
  std::vector<BoundaryValue> out = {{"y", "tensor", "float32", {}}, {"k1", "int", "int64", {}}};
  StageExecutor e(m, in, out, /*inputs_need_grad=*/true);
  torch::Tensor x = torch::ones({2, 2});
  auto y = e.forward(0, {x, torch::tensor(int64_t(3)), torch::tensor(0.5, torch::kDouble)});
  EXPECT_TRUE(y[0].allclose(torch::full({2, 2}, 1.5)));
  EXPECT_EQ(y[1].item<int64_t>(), 4);
  EXPECT_EQ(e.pendingMicrobatches(), 1u);
  auto g = e.backward(0, {torch::ones({2, 2}), torch::Tensor()});
  EXPECT_TRUE(g[0].allclose(torch::full({2, 2}, 1.5)));
  EXPECT_FALSE(g[1].defined());
  EXPECT_EQ(e.pendingMicrobatches(), 0u);
}

}  // namespace
}  // namespace cairn
