// Replays the fuzz seed corpus and every kept crash input through the fuzz target bodies, so a
// fixed crash stays fixed even where clang/libFuzzer are not used. Also (re)creates the wire
// seeds from real encoded messages when CAIRN_WRITE_FUZZ_SEEDS names a folder.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "node/transport/WireCodec.h"
#include "tests/fuzz/FuzzTargets.h"

namespace fs = std::filesystem;

namespace cairn {
namespace {

const fs::path kFuzzDir = fs::path(CAIRN_SOURCE_DIR) / "tests" / "fuzz";

std::vector<uint8_t> readBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

size_t replay(const fs::path& folder, void (*target)(const uint8_t*, size_t)) {
  size_t n = 0;
  if (!fs::exists(folder)) return 0;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (!entry.is_regular_file() || entry.path().filename() == "README.md") continue;
    const auto bytes = readBytes(entry.path());
    SCOPED_TRACE(entry.path().string());
    target(bytes.data(), bytes.size());
    ++n;
  }
  return n;
}

TEST(FuzzReplay, WireCorpusAndRegressions) {
  const size_t seeds = replay(kFuzzDir / "corpus" / "wire", &fuzz::wireDecoder);
  replay(kFuzzDir / "regressions" / "wire", &fuzz::wireDecoder);
  EXPECT_GE(seeds, 4u) << "the wire seed corpus is missing";
}

TEST(FuzzReplay, NodeDataCorpusAndRegressions) {
  const size_t seeds = replay(kFuzzDir / "corpus" / "node_data", &fuzz::nodeData);
  replay(kFuzzDir / "regressions" / "node_data", &fuzz::nodeData);
  EXPECT_GE(seeds, 3u) << "the node_data seed corpus is missing";
}

// The wire seeds are real encoded messages; this checks they still decode with today's codec
// (so the fuzzer starts from valid inputs), and regenerates them on request.
TEST(FuzzReplay, WireSeedsMatchTodaysEncoding) {
  std::vector<Message> messages(4);
  messages[0].kind = MessageKind::kActivation;
  messages[0].tensors = {{"x", torch::arange(12, torch::kFloat32).reshape({3, 4})}};
  messages[1].kind = MessageKind::kGradient;
  messages[1].sender = "node_2";
  messages[1].tensors = {{"g", torch::ones({2}, torch::kBFloat16)}, {"b", torch::zeros({3}, torch::kBool)}};
  messages[2].kind = MessageKind::kControl;
  messages[2].text = "{\"hello\":1}";
  messages[3].kind = MessageKind::kCollective;
  messages[3].tag = "ring";
  messages[3].tensors = {{"i", torch::arange(5, torch::kInt64)}, {"e", torch::empty({0, 3})}, {"s", torch::tensor(3.5)}};
  const char* out_dir = std::getenv("CAIRN_WRITE_FUZZ_SEEDS");
  for (size_t i = 0; i < messages.size(); ++i) {
    auto frames = encodeMessage(messages[i]);
    std::vector<std::string> parts;
    for (auto& f : frames) parts.emplace_back(static_cast<const char*>(f.data()), f.size());
    const auto packed = fuzz::packFrames(parts);
    if (out_dir) {
      std::ofstream(fs::path(out_dir) / ("message_" + std::to_string(i)), std::ios::binary)
          .write(reinterpret_cast<const char*>(packed.data()), packed.size());
    }
    const auto stored = readBytes(kFuzzDir / "corpus" / "wire" / ("message_" + std::to_string(i)));
    EXPECT_EQ(stored, packed) << "seed message_" << i << " is stale; regenerate with CAIRN_WRITE_FUZZ_SEEDS";
  }
}

}  // namespace
}  // namespace cairn
