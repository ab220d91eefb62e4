// job.json `data` options of the dataset formats: parsed with their defaults, and every wrong
// value or misplaced key is a BadInput naming the key.
#include <gtest/gtest.h>

#include <fstream>

#include "core/Error.h"
#include "trainer/Dataset.h"
#include "trainer/TrainOptions.h"

namespace cairn {
namespace {

DataOptions parse(const std::string& format, const nlohmann::json& options) {
  DataSpec spec;
  spec.location = "/somewhere";
  spec.format = format;
  spec.options = options;
  return parseDataOptions(spec, "job.json");
}

void expectRejected(const std::string& format, const nlohmann::json& options,
                    const std::string& key) {
  try {
    parse(format, options);
    ADD_FAILURE() << options.dump() << " was accepted for " << format;
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("data." + key), std::string::npos) << e.what();
  }
}

TEST(DataOptions, DatasetKeysAndDefaults) {
  DataOptions d = parse("images", {{"resize", 32},
                                   {"random_crop", {{"size", {28, 30}}, {"padding", 4}}},
                                   {"channels", 1},
                                   {"random_flip", true}});
  EXPECT_EQ(d.resize, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(d.random_crop.size, (std::vector<int64_t>{28, 30}));
  EXPECT_EQ(d.random_crop.padding, 4);
  EXPECT_EQ(d.channels, 1);
  DataOptions a =
      parse("npy", {{"inputs", {"input_ids", "attention_mask"}}, {"targets", "labels"}});
  EXPECT_EQ(a.inputs, (std::vector<std::string>{"input_ids", "attention_mask"}));
  EXPECT_EQ(a.targets, "labels");
  DataOptions t = parse("tokens", {{"token_dtype", "uint16"}, {"block_length", 1024}});
  EXPECT_EQ(t.token_dtype, "uint16");
  DataOptions defaults = parse("safetensors", nlohmann::json::object());
  EXPECT_EQ(defaults.inputs, (std::vector<std::string>{"inputs"}));
  EXPECT_EQ(defaults.targets, "targets");
  EXPECT_EQ(parse("tokens", nlohmann::json::object()).token_dtype, "uint8");
}

TEST(DataOptions, WrongValuesAndMisplacedKeysNameTheKey) {
  expectRejected("images", {{"channels", 2}}, "channels");
  expectRejected("images", {{"resize", {0, 4}}}, "resize");
  expectRejected("images", {{"resize", {4, 4, 4}}}, "resize");
  expectRejected("images", {{"random_crop", {{"size", 8}, {"pad", 1}}}}, "random_crop");
  expectRejected("tokens", {{"random_crop", {{"size", 8}}}}, "random_crop");
  expectRejected("tokens", {{"normalize", {{"mean", {0.5}}}}}, "normalize");
  expectRejected("idx", {{"channels", 3}}, "channels");
  expectRejected("tokens", {{"inputs", {"x"}}}, "inputs");
  expectRejected("npy", {{"inputs", nlohmann::json::array()}}, "inputs");
  expectRejected("npy", {{"inputs", {"x", "x"}}}, "inputs");
  expectRejected("npy", {{"inputs", {"x"}}, {"targets", "x"}}, "targets");
  expectRejected("tokens", {{"token_dtype", "int16"}}, "token_dtype");
  expectRejected("npy", {{"token_dtype", "uint16"}}, "token_dtype");
  expectRejected("idx", {{"test_location", "/t"}}, "test_location");
  expectRejected("tokens", {{"shards", 3}}, "shards");
}

// The idx format takes the image transforms too (Fashion-MNIST, when installed).
TEST(DataOptions, IdxTakesRandomCropWithPadding) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::ifstream(dir + "/train-labels-idx1-ubyte.gz").good())
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  DataOptions o = parse("idx", {{"random_crop", {{"size", 28}, {"padding", 4}}},
                                {"test_samples", 10},
                                {"train_samples", 100}});
  o.location = dir;
  DatasetPair d = loadDatasets(o, 9);
  Batch plain = d.train->get({3, 4}, false);
  Batch cropped = d.train->get({3, 4}, true);
  EXPECT_EQ(cropped.inputs.sizes(), plain.inputs.sizes());
  EXPECT_FALSE(cropped.inputs.equal(plain.inputs));  // shifted (the seed moves both samples)
  // A shifted window of the padded image: its pixel sum is at most the original's.
  EXPECT_LE(cropped.inputs.sum().item<float>(), plain.inputs.sum().item<float>() + 1e-3);
}

}  // namespace
}  // namespace cairn
