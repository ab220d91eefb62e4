// The built-in losses with label smoothing and BCE with logits, and TorchScript losses, against
// PyTorch: tests/trainer/make_loss_references.py computed F.cross_entropy(label_smoothing=...) and
// F.binary_cross_entropy_with_logits(pos_weight=...) and their gradients on the same logits and
// targets (float64), and wrote the TorchScript loss modules. cairn computes the loss the way the
// Leaf does: micro-batches of UNEQUAL size, each its sum divided by the Root's count of the whole
// batch, each backward on its own; the shares must add up to torch's batch mean and its gradient.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/Error.h"
#include "core/JobFiles.h"
#include "core/Safetensors.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Loss.h"
#include "trainer/ScriptedLoss.h"
#include "trainer/TrainOptions.h"

namespace cairn {
namespace {

std::string lossDir() {
  return testing::trainerModelsDir() + "/losses";
}

std::map<std::string, torch::Tensor> references() {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : readSafetensors(lossDir() + "/builtin.safetensors")) out[name] = t;
  return out;
}

struct Split {
  double loss = 0;
  torch::Tensor grad;
};

// The Leaf's way: the Root counts the terms of the whole batch, every micro-batch divides its sum
// by that count and runs its own backward.
Split splitLoss(const LossOptions& o, const torch::Tensor& logits, const torch::Tensor& targets,
                const std::vector<int64_t>& sizes) {
  torch::Tensor x = logits.detach().clone().requires_grad_(true);
  const double denominator = double(lossTermCount(o, targets));
  Split s;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    torch::Tensor share =
        microbatchLoss(o, x.narrow(0, offset, size), targets.narrow(0, offset, size), denominator);
    share.backward();
    s.loss += share.item<double>();
    offset += size;
  }
  EXPECT_EQ(offset, logits.size(0)) << "the micro-batch sizes must cover the batch";
  s.grad = x.grad();
  return s;
}

void expectEqualTo(const Split& s, const torch::Tensor& loss, const torch::Tensor& grad,
                   double tolerance) {
  EXPECT_NEAR(s.loss, loss.item<double>(), tolerance);
  ASSERT_TRUE(s.grad.defined());
  ASSERT_EQ(s.grad.sizes(), grad.sizes());
  EXPECT_LE((s.grad - grad).abs().max().item<double>(), tolerance);
}

LossOptions scripted(const std::string& file) {
  LossOptions o;
  o.kind = LossKind::kTorchScript;
  o.torchscript_path = lossDir() + "/" + file;
  o.scripted = ScriptedLoss::load(o.torchscript_path, "job.json", "training_definition.loss_fn");
  return o;
}

TEST(BuiltinLoss, LabelSmoothingMatchesTorchCrossEntropy) {
  auto ref = references();
  LossOptions o;
  o.label_smoothing = 0.1;
  expectEqualTo(splitLoss(o, ref["ce_logits"], ref["ce_targets"], {5, 1, 7}), ref["ce_ls_loss"],
                ref["ce_ls_grad"], 1e-12);
  // (N, T, C) sequences, smoothing 0.25.
  o.label_smoothing = 0.25;
  expectEqualTo(splitLoss(o, ref["seq_logits"], ref["seq_targets"], {1, 3}), ref["seq_ls_loss"],
                ref["seq_ls_grad"], 1e-12);
  // Without smoothing: the plain cross-entropy, as before.
  o.label_smoothing = 0;
  expectEqualTo(splitLoss(o, ref["ce_logits"], ref["ce_targets"], {13}), ref["ce_loss"],
                ref["ce_grad"], 1e-12);
  // Evaluation sums the same terms.
  o.label_smoothing = 0.1;
  EvalTally t = evaluationTally(o, ref["ce_logits"], ref["ce_targets"]);
  EXPECT_EQ(t.terms, 10);  // 13 targets, 3 ignored
  EXPECT_NEAR(t.loss_sum / double(t.terms), ref["ce_ls_loss"].item<double>(), 1e-12);
}

TEST(BuiltinLoss, BceWithLogitsMatchesTorch) {
  auto ref = references();
  LossOptions o;
  o.kind = LossKind::kBceWithLogits;
  expectEqualTo(splitLoss(o, ref["bce_logits"], ref["bce_targets"], {4, 7}), ref["bce_loss"],
                ref["bce_grad"], 1e-12);
  o.pos_weight = {0.5, 1.0, 2.0, 3.0};
  expectEqualTo(splitLoss(o, ref["bce_logits"], ref["bce_targets"], {2, 6, 3}), ref["bce_pw_loss"],
                ref["bce_pw_grad"], 1e-12);
  // Evaluation: every element is a term; "correct" = the logit on the target's side of 0.
  EvalTally t = evaluationTally(o, ref["bce_logits"], ref["bce_targets"]);
  EXPECT_EQ(t.terms, 44);
  EXPECT_NEAR(t.loss_sum / 44, ref["bce_pw_loss"].item<double>(), 1e-12);
  int64_t correct = 0;
  auto logits = ref["bce_logits"].accessor<double, 2>();
  auto targets = ref["bce_targets"].accessor<double, 2>();
  for (int64_t i = 0; i < 11; ++i)
    for (int64_t j = 0; j < 4; ++j) correct += (logits[i][j] > 0) == (targets[i][j] >= 0.5);
  EXPECT_EQ(t.correct, correct);
  EXPECT_TRUE(lossReportsAccuracy(o));
  // A pos_weight that fits no class dimension is named.
  o.pos_weight = {1.0, 2.0};
  EXPECT_THROW(splitLoss(o, ref["bce_logits"], ref["bce_targets"], {11}), BadInput);
}

// A TorchScript cross-entropy (written out by hand in make_loss_references.py, returning its sum
// and count, with count(target) exported) trains exactly like the built-in one and like torch.
TEST(ScriptedLoss, CrossEntropyModuleMatchesBuiltinAndTorch) {
  auto ref = references();
  const LossOptions module = scripted("loss_ce.pt");
  const Split mine = splitLoss(module, ref["ce_logits"], ref["ce_targets"], {6, 2, 5});
  expectEqualTo(mine, ref["ce_loss"], ref["ce_grad"], 1e-12);
  const Split builtin = splitLoss(LossOptions{}, ref["ce_logits"], ref["ce_targets"], {6, 2, 5});
  EXPECT_NEAR(mine.loss, builtin.loss, 1e-12);
  EXPECT_LE((mine.grad - builtin.grad).abs().max().item<double>(), 1e-12);
  EXPECT_EQ(lossTermCount(module, ref["ce_targets"]), 10);  // the module's count(target)

  const LossOptions smoothed = scripted("loss_ce_ls.pt");
  expectEqualTo(splitLoss(smoothed, ref["ce_logits"], ref["ce_targets"], {3, 9, 1}),
                ref["ce_ls_loss"], ref["ce_ls_grad"], 1e-12);
  EvalTally t = evaluationTally(smoothed, ref["ce_logits"], ref["ce_targets"]);
  EXPECT_EQ(t.terms, 10);
  EXPECT_NEAR(t.loss_sum / double(t.terms), ref["ce_ls_loss"].item<double>(), 1e-12);
  EXPECT_FALSE(lossReportsAccuracy(smoothed));
}

// Without a count method the Root counts target.numel(); the module's own count must agree.
TEST(ScriptedLoss, ModuleWithoutCountUsesTargetElements) {
  auto ref = references();
  const LossOptions module = scripted("loss_bce.pt");
  EXPECT_EQ(lossTermCount(module, ref["bce_targets"]), 44);
  expectEqualTo(splitLoss(module, ref["bce_logits"], ref["bce_targets"], {5, 5, 1}),
                ref["bce_loss"], ref["bce_grad"], 1e-12);
}

// ---- bad inputs: BadInput naming job.json, the key and the file -----------------------------

class BadLossModule : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cairn_bad_loss_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string save(const std::string& file, const std::string& source) {
    torch::jit::Module m("BadLoss");
    if (!source.empty()) m.define(source);
    m.save((dir_ / file).string());
    return file;
  }
  // The error of parsing {"loss_fn": {"torchscript": file}} from DIR/job.json ("" if none).
  std::string parseError(const nlohmann::json& loss_fn) {
    try {
      parseTrainOptions({{"loss_fn", loss_fn}}, (dir_ / "job.json").string());
    } catch (const BadInput& e) {
      return e.what();
    }
    return "";
  }
  // The error of the first micro-batch (what the Leaf does) with this module.
  std::string trainingError(const std::string& file, const torch::Tensor& output,
                            const torch::Tensor& target) {
    try {
      TrainOptions o = parseTrainOptions({{"loss_fn", {{"torchscript", file}}}},
                                         (dir_ / "job.json").string());
      microbatchLoss(o.loss, output, target, double(lossTermCount(o.loss, target)));
    } catch (const BadInput& e) {
      return e.what();
    }
    return "";
  }
  void expectNamesKeyAndFile(const std::string& message, const std::string& file,
                             const std::string& what) {
    SCOPED_TRACE(file);
    EXPECT_NE(message.find("job.json: training_definition.loss_fn.torchscript"), std::string::npos)
        << message;
    EXPECT_NE(message.find((dir_ / file).string()), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
  std::filesystem::path dir_;
};

TEST_F(BadLossModule, RelativePathIsReadFromJobJsonsFolder) {
  std::filesystem::copy_file(lossDir() + "/loss_ce.pt", dir_ / "my_loss.pt");
  TrainOptions o = parseTrainOptions({{"loss_fn", {{"torchscript", "my_loss.pt"}}}},
                                     (dir_ / "job.json").string());
  EXPECT_EQ(o.loss.kind, LossKind::kTorchScript);
  EXPECT_EQ(o.loss.torchscript_path, (dir_ / "my_loss.pt").string());
  ASSERT_NE(o.loss.scripted, nullptr);
  // An absolute path is taken as it is.
  o = parseTrainOptions({{"loss_fn", {{"torchscript", lossDir() + "/loss_bce.pt"}}}},
                        (dir_ / "job.json").string());
  EXPECT_EQ(o.loss.torchscript_path, lossDir() + "/loss_bce.pt");
}

TEST_F(BadLossModule, MissingOrUnreadableFile) {
  expectNamesKeyAndFile(parseError({{"torchscript", "nowhere.pt"}}), "nowhere.pt", "no such file");
  std::ofstream(dir_ / "garbage.pt") << "not a zip archive";
  expectNamesKeyAndFile(parseError({{"torchscript", "garbage.pt"}}), "garbage.pt",
                        "not a TorchScript module");
  std::filesystem::create_directory(dir_ / "folder.pt");
  expectNamesKeyAndFile(parseError({{"torchscript", "folder.pt"}}), "folder.pt", "not a file");
  EXPECT_NE(parseError({{"torchscript", ""}}).find("loss_fn.torchscript must name"),
            std::string::npos);
  EXPECT_NE(parseError({{"torchscript", "x.pt"}, {"name", "mse"}}).find("loss_fn.name"),
            std::string::npos);
}

TEST_F(BadLossModule, WrongMethods) {
  save("no_forward.pt", "def count(self, target: Tensor) -> int:\n  return 1\n");
  expectNamesKeyAndFile(parseError({{"torchscript", "no_forward.pt"}}), "no_forward.pt",
                        "has no forward method");
  save("mean.pt", "def forward(self, output: Tensor, target: Tensor) -> Tensor:\n"
                  "  return output.mean()\n");
  expectNamesKeyAndFile(parseError({{"torchscript", "mean.pt"}}), "mean.pt",
                        "forward must be forward(output: Tensor, target: Tensor)");
  save("one_arg.pt", "def forward(self, output: Tensor) -> Tuple[Tensor, int]:\n"
                     "  return output.sum(), 1\n");
  expectNamesKeyAndFile(parseError({{"torchscript", "one_arg.pt"}}), "one_arg.pt",
                        "forward must be");
  save("bad_count.pt",
       "def forward(self, output: Tensor, target: Tensor) -> Tuple[Tensor, int]:\n"
       "  return output.sum(), 1\n"
       "def count(self, target: Tensor) -> str:\n  return 'x'\n");
  expectNamesKeyAndFile(parseError({{"torchscript", "bad_count.pt"}}), "bad_count.pt",
                        "count must be count(target: Tensor)");
  torch::jit::Module with_weight("WithWeight");
  with_weight.register_parameter("scale", torch::ones({1}).requires_grad_(true),
                                 /*is_buffer=*/false);
  with_weight.define("def forward(self, output: Tensor, target: Tensor) -> Tuple[Tensor, int]:\n"
                     "  return (output * self.scale).sum(), 1\n");
  with_weight.save((dir_ / "weight.pt").string());
  expectNamesKeyAndFile(parseError({{"torchscript", "weight.pt"}}), "weight.pt",
                        "parameter \"scale\" requires grad");
}

TEST_F(BadLossModule, WrongResultsAtTheFirstMicrobatch) {
  const torch::Tensor output = torch::randn({4, 3}).requires_grad_(true);
  const torch::Tensor target = torch::tensor({0, 2, 1, 1}, torch::kLong);
  // Per-sample terms instead of their sum.
  save("terms.pt", "def forward(self, output: Tensor, target: Tensor) -> Tuple[Tensor, int]:\n"
                   "  return output.sum(1), 4\n");
  expectNamesKeyAndFile(trainingError("terms.pt", output, target), "terms.pt",
                        "one floating-point element");
  // A count that is not a whole number.
  save("half.pt", "def forward(self, output: Tensor, target: Tensor) -> Tuple[Tensor, Tensor]:\n"
                  "  return output.sum(), torch.tensor(2.5)\n");
  expectNamesKeyAndFile(trainingError("half.pt", output, target), "half.pt",
                        "non-negative whole number");
  // A count that follows the output, not the target (12 elements of output, 4 targets).
  save("by_output.pt",
       "def forward(self, output: Tensor, target: Tensor) -> Tuple[Tensor, int]:\n"
       "  return output.sum(), output.numel()\n");
  expectNamesKeyAndFile(trainingError("by_output.pt", output, target), "by_output.pt",
                        "forward counted 12 loss terms, but target.numel()");
  // A sum cut off from the output.
  save("detached.pt", "def forward(self, output: Tensor, target: Tensor) -> Tuple[Tensor, int]:\n"
                      "  return output.detach().sum(), 4\n");
  expectNamesKeyAndFile(trainingError("detached.pt", output, target), "detached.pt",
                        "does not depend on the output");
  // The module itself fails (it expects float targets).
  save("raises.pt",
       "def forward(self, output: Tensor, target: Tensor) -> Tuple[Tensor, int]:\n"
       "  return torch.binary_cross_entropy_with_logits(output, target).sum(), 4\n");
  expectNamesKeyAndFile(trainingError("raises.pt", output, target), "raises.pt",
                        "forward(output Float [4, 3], target Long [4]) failed");
}

// A volunteer has job.json, node.json and stage.pt only: clusterize embeds the loss file in
// job.json (core/JobFiles.h), and a provider in another folder, without the file, loads it.
TEST_F(BadLossModule, EmbeddedInJobJsonTravelsWithIt) {
  const std::filesystem::path user = dir_ / "user";
  const std::filesystem::path volunteer = dir_ / "volunteer";
  std::filesystem::create_directories(user);
  std::filesystem::create_directories(volunteer);
  std::filesystem::copy_file(lossDir() + "/loss_ce_ls.pt", user / "loss.pt");
  nlohmann::json training = {{"loss_fn", {{"torchscript", "loss.pt"}}}};
  ASSERT_TRUE(embedJobFiles(&training, (user / "job.json").string()));
  EXPECT_FALSE(embedJobFiles(&training, (user / "job.json").string())) << "embedded twice";
  std::ifstream in(user / "loss.pt", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(decodeBase64(training["loss_fn"]["torchscript_base64"].get<std::string>()), bytes);

  const TrainOptions o = parseTrainOptions(training, (volunteer / "job.json").string());
  ASSERT_EQ(o.loss.kind, LossKind::kTorchScript);
  auto ref = references();
  expectEqualTo(splitLoss(o.loss, ref["ce_logits"], ref["ce_targets"], {4, 9}), ref["ce_ls_loss"],
                ref["ce_ls_grad"], 1e-12);

  // Nothing to embed: built-in losses, or no loss_fn.
  nlohmann::json builtin = {{"loss_fn", "mse"}};
  EXPECT_FALSE(embedJobFiles(&builtin, (user / "job.json").string()));
  // Errors name the job file, the key and the file.
  nlohmann::json missing = {{"loss_fn", {{"torchscript", "gone.pt"}}}};
  try {
    embedJobFiles(&missing, (user / "job.json").string());
    ADD_FAILURE() << "no error for a missing loss file";
  } catch (const BadInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((user / "job.json").string() + ": training_definition.loss_fn.torchscript"),
              std::string::npos) << m;
    EXPECT_NE(m.find((user / "gone.pt").string()), std::string::npos) << m;
  }
  nlohmann::json bad = {{"loss_fn", {{"torchscript", "loss.pt"}, {"torchscript_base64", "a$=="}}}};
  EXPECT_NE(parseError(bad["loss_fn"]).find("training_definition.loss_fn.torchscript_base64 is not "
                                            "valid base64"),
            std::string::npos);
  nlohmann::json garbage = {
      {"loss_fn", {{"torchscript", "loss.pt"}, {"torchscript_base64", encodeBase64("no zip")}}}};
  const std::string m = parseError(garbage["loss_fn"]);
  EXPECT_NE(m.find("training_definition.loss_fn.torchscript (loss.pt, embedded in job.json): not a "
                   "TorchScript module"),
            std::string::npos) << m;
}

TEST(JobFiles, Base64RoundTripAndRejects) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(char(c));
  for (size_t n = 0; n <= all.size(); n += 37)
    EXPECT_EQ(decodeBase64(encodeBase64(all.substr(0, n))), all.substr(0, n)) << n;
  EXPECT_EQ(encodeBase64("Man"), "TWFu");  // RFC 4648 examples
  EXPECT_EQ(encodeBase64("fo"), "Zm8=");
  EXPECT_EQ(encodeBase64("f"), "Zg==");
  EXPECT_EQ(decodeBase64("Zm9vYmFy"), "foobar");
  for (const char* bad : {"Zg=", "Z===", "Zg==Zg==", "Zm9v YmFy", "Zm=v", "Zm9*"})
    EXPECT_EQ(decodeBase64(bad), std::nullopt) << bad;
}

TEST(TrainOptions, LossFieldsAreValidated) {
  auto message = [](const nlohmann::json& loss_fn) {
    try {
      parseTrainOptions({{"loss_fn", loss_fn}}, "job.json");
    } catch (const BadInput& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainOptions o = parseTrainOptions(
      {{"loss_fn", {{"name", "cross_entropy"}, {"label_smoothing", 0.1}, {"ignore_index", 0}}}},
      "job.json");
  EXPECT_DOUBLE_EQ(o.loss.label_smoothing, 0.1);
  EXPECT_EQ(o.loss.ignore_index, 0);
  o = parseTrainOptions({{"loss_fn", "bce_with_logits"}}, "job.json");
  EXPECT_EQ(o.loss.kind, LossKind::kBceWithLogits);
  o = parseTrainOptions({{"loss_fn", {{"name", "bce_with_logits"}, {"pos_weight", 2}}}}, "job.json");
  EXPECT_EQ(o.loss.pos_weight, std::vector<double>{2.0});
  EXPECT_EQ(message({{"name", "cross_entropy"}, {"label_smoothing", 1.0}}),
            "job.json: training_definition.loss_fn.label_smoothing must be in [0, 1)");
  EXPECT_EQ(message({{"name", "mse"}, {"label_smoothing", 0.1}}),
            "job.json: training_definition.loss_fn.label_smoothing applies to cross_entropy only");
  EXPECT_EQ(message({{"name", "cross_entropy"}, {"pos_weight", {1, 2}}}),
            "job.json: training_definition.loss_fn.pos_weight applies to bce_with_logits only");
  EXPECT_EQ(message({{"name", "bce_with_logits"}, {"pos_weight", {1, -2}}}),
            "job.json: training_definition.loss_fn.pos_weight must hold non-negative numbers");
  EXPECT_EQ(message({{"name", "bce_with_logits"}, {"ignore_index", 3}}),
            "job.json: training_definition.loss_fn.ignore_index applies to cross_entropy and nll "
            "only");
  EXPECT_NE(message("hinge").find("training_definition.loss_fn"), std::string::npos);
}

}  // namespace
}  // namespace cairn
