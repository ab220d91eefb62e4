// training_definition.wire: parsing and validation (docs/TRAINING.md "Compression on the wire").
#include <gtest/gtest.h>

#include <string>

#include "core/Error.h"
#include "trainer/TrainOptions.h"

namespace cairn {
namespace {

std::string errorOf(const nlohmann::json& training_definition) {
  try {
    parseTrainOptions(training_definition, "job.json");
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST(WireOptions, DefaultIsUncompressed) {
  const TrainOptions o = parseTrainOptions(nlohmann::json::object(), "job.json");
  EXPECT_EQ(o.wire.activations, WireCodec::kFp32);
  EXPECT_EQ(o.wire.sync, WireCodec::kFp32);
  const TrainOptions empty = parseTrainOptions({{"wire", nlohmann::json::object()}}, "job.json");
  EXPECT_EQ(empty.wire.activations, WireCodec::kFp32);
  EXPECT_EQ(empty.wire.sync, WireCodec::kFp32);
}

TEST(WireOptions, EveryAllowedCodecParses) {
  for (const char* a : {"fp32", "bf16", "fp16", "int8"})
    for (const char* s : {"fp32", "bf16", "int8"}) {
      const TrainOptions o =
          parseTrainOptions({{"wire", {{"activations", a}, {"sync", s}}}}, "job.json");
      EXPECT_EQ(toString(o.wire.activations), a);
      EXPECT_EQ(toString(o.wire.sync), s);
      EXPECT_EQ(o.sync.wire, o.wire.sync);  // what the rings' groups use (SyncOptions::wire)
    }
}

TEST(WireOptions, BadValuesNameTheKeyAndTheChoices) {
  std::string e = errorOf({{"wire", {{"activations", "int4"}}}});
  EXPECT_NE(e.find("job.json: training_definition.wire.activations"), std::string::npos) << e;
  EXPECT_NE(e.find("int8"), std::string::npos) << e;
  // fp16 is for activations only: ring syncs accumulate in fp32 from bf16 or int8.
  e = errorOf({{"wire", {{"sync", "fp16"}}}});
  EXPECT_NE(e.find("job.json: training_definition.wire.sync"), std::string::npos) << e;
  EXPECT_NE(e.find("bf16"), std::string::npos) << e;
  e = errorOf({{"wire", {{"sync", 8}}}});
  EXPECT_NE(e.find("training_definition.wire.sync"), std::string::npos) << e;
  e = errorOf({{"wire", {{"activation", "bf16"}}}});
  EXPECT_NE(e.find("activation"), std::string::npos) << e;
  EXPECT_FALSE(e.empty());
  e = errorOf({{"wire", "bf16"}});
  EXPECT_NE(e.find("job.json: training_definition.wire must be an object"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace cairn
