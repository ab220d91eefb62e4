// core/Safetensors: round trips of every dtype (empty and 0-d tensors included) and one hand-made
// malformed file per validation rule, each rejected with a BadInput naming the file and tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "core/Error.h"
#include "core/Safetensors.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

// A folder of this process's files, removed when the tests end.
struct TemporaryFolder {
  fs::path path = fs::temp_directory_path() / ("cairn_safetensors_" + std::to_string(getpid()));
  TemporaryFolder() { fs::create_directories(path); }
  ~TemporaryFolder() { fs::remove_all(path); }
};

std::string temporaryFile(const std::string& name) {
  static const TemporaryFolder folder;
  return (folder.path / name).string();
}

// A file made by hand: 8-byte little-endian length (`claimed_length`, default the header's), the
// header text, then `data` bytes.
std::string craft(const std::string& name, const std::string& header, size_t data_bytes,
                  int64_t claimed_length = -1) {
  const std::string path = temporaryFile(name);
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = claimed_length < 0 ? header.size() : uint64_t(claimed_length);
  for (int i = 0; i < 8; ++i) out.put(char((length >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\x01');
  return path;
}

std::string readError(const std::string& path) {
  try {
    readSafetensors(path);
  } catch (const BadInput& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Safetensors, RoundTripsEveryDtypeInOrder) {
  torch::manual_seed(3);
  const NamedTensors tensors = {
      {"f64", torch::randn({2, 3}, torch::kDouble)},
      {"f32", torch::randn({4})},
      {"f16", torch::randn({3, 1}).to(torch::kHalf)},
      {"bf16", torch::randn({5}).to(torch::kBFloat16)},
      {"i64", torch::arange(6, torch::kLong).reshape({2, 3})},
      {"i32", torch::arange(-2, 2, torch::kInt)},
      {"i16", torch::arange(3, torch::kShort)},
      {"i8", torch::arange(-3, 3, torch::kChar)},
      {"u8", torch::arange(250, 256, torch::kLong).to(torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(2.5)},
      {"empty", torch::zeros({0, 4})},
      {"strided", torch::arange(12.0).reshape({3, 4}).t()},  // written contiguous
  };
  const std::string path = temporaryFile("all.safetensors");
  writeSafetensors(path, tensors, {{"format", "pt"}});
  const NamedTensors back = readSafetensors(path);
  ASSERT_EQ(back.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(back[i].first, tensors[i].first);
    EXPECT_EQ(back[i].second.scalar_type(), tensors[i].second.scalar_type()) << back[i].first;
    EXPECT_TRUE(torch::equal(back[i].second, tensors[i].second)) << back[i].first;
  }
  EXPECT_EQ(readSafetensorsMetadata(path), (std::map<std::string, std::string>{{"format", "pt"}}));
  // The header length keeps the data 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  EXPECT_EQ(length % 8, 0u);
}

TEST(Safetensors, WriteRejectsDuplicateAndUnsupported) {
  const std::string path = temporaryFile("bad_write.safetensors");
  try {
    writeSafetensors(path, {{"a", torch::zeros({1})}, {"a", torch::zeros({1})}});
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_EQ(std::string(e.what()), path + ": tensor name \"a\" appears twice");
  }
  EXPECT_THROW(writeSafetensors(path, {{"c", torch::zeros({1}, torch::kComplexFloat)}}), BadInput);
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, MalformedFilesAreRejectedByName) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(readError(craft("ok.safetensors", ok, 8)), "(no error)");

  std::string p = temporaryFile("short.safetensors");
  std::ofstream(p) << "abc";
  EXPECT_EQ(readError(p), p + ": too short for a safetensors file (3 bytes)");

  p = craft("long_header.safetensors", ok, 8, 1000);
  EXPECT_EQ(readError(p), p + ": safetensors header length 1000 exceeds the file (" +
                              std::to_string(8 + ok.size() + 8) + " bytes)");

  p = craft("not_json.safetensors", "{\"a\":", 0);
  EXPECT_NE(readError(p).find(p + ": safetensors header is not JSON: "), std::string::npos);

  p = craft("array.safetensors", "[1,2]", 0);
  EXPECT_EQ(readError(p), p + ": safetensors header is not a JSON object");

  p = craft("dtype.safetensors", R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_EQ(readError(p), p + ": tensor \"a\": unsupported safetensors dtype \"F8\" (cairn reads "
                              "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");

  p = craft("negative.safetensors", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
            8);
  EXPECT_EQ(readError(p),
            p + ": tensor \"a\": shape must be a list of non-negative integers (got [-2])");

  p = craft("key.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})",
            8);
  EXPECT_EQ(readError(p), p + ": tensor \"a\": unknown header key \"x\"");

  p = craft("outside.safetensors", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  EXPECT_EQ(readError(p),
            p + ": tensor \"a\": data_offsets [0, 16] lie outside the data section of 8 bytes");

  p = craft("length.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_EQ(readError(p),
            p + ": tensor \"a\": data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12");

  // A shape whose byte count overflows 64 bits must not wrap around to a small number.
  p = craft("overflow.safetensors",
            R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(readError(p), p + ": tensor \"a\": data_offsets [0, 0] hold 0 bytes but shape "
                              "[4611686018427387904,4] of F32 needs more than 2^64");

  p = craft(
      "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
      8);
  EXPECT_EQ(readError(p),
            p + ": tensors \"a\" and \"b\" overlap (bytes [0, 8) and [4, 8) of the data section)");

  p = craft(
      "hole.safetensors",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
      12);
  EXPECT_EQ(readError(p),
            p + ": bytes [4, 8) of the data section belong to no tensor (before tensor \"b\")");

  p = craft("trailing.safetensors", ok, 12);
  EXPECT_EQ(readError(p), p + ": the data section has 12 bytes but its tensors cover 8");

  p = craft("metadata.safetensors", R"({"__metadata__":{"format":1}})", 0);
  EXPECT_EQ(readError(p), p + ": __metadata__ \"format\" must be a string");

  EXPECT_EQ(readError(temporaryFile("absent.safetensors")),
            temporaryFile("absent.safetensors") + ": cannot open");
}

}  // namespace
}  // namespace cairn
