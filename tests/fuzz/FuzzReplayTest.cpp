// Replays the fuzz seed corpus and every kept crash input through the fuzz target bodies, so a
// fixed crash stays fixed even where clang/libFuzzer are not used. Also (re)creates the seeds of
// the wire and protocol targets from real encoded messages when CAIRN_WRITE_FUZZ_SEEDS names a
// folder (one subfolder per corpus).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <fstream>
#include <iterator>

#include "node/protocol/ChunkMessages.h"
#include "node/protocol/CollectiveNotices.h"
#include "node/protocol/Coordination.h"
#include "node/protocol/PipelineControl.h"
#include "node/protocol/RingJoin.h"
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

// A protocol target's corpus: its seeds (real encoded messages, each accepted by its decoder:
// `accepts`) match today's encoding, and every seed and kept crash input replays.
void checkProtocolCorpus(const std::string& corpus, const std::vector<std::vector<std::string>>& messages,
                         const std::function<bool(const std::vector<std::string>&)>& accepts,
                         void (*target)(const uint8_t*, size_t)) {
  const char* out_dir = std::getenv("CAIRN_WRITE_FUZZ_SEEDS");
  for (size_t i = 0; i < messages.size(); ++i) {
    SCOPED_TRACE(corpus + " seed " + std::to_string(i));
    EXPECT_TRUE(accepts(messages[i])) << "the decoder refuses a message its own encoder wrote";
    const auto packed = fuzz::packFrames(messages[i]);
    const fs::path file = kFuzzDir / "corpus" / corpus / ("message_" + std::to_string(i));
    if (out_dir) {
      fs::create_directories(fs::path(out_dir) / corpus);
      std::ofstream(fs::path(out_dir) / corpus / file.filename(), std::ios::binary)
          .write(reinterpret_cast<const char*>(packed.data()), packed.size());
    }
    EXPECT_EQ(readBytes(file), packed) << file << " is stale; regenerate with CAIRN_WRITE_FUZZ_SEEDS";
  }
  EXPECT_EQ(replay(kFuzzDir / "corpus" / corpus, target), messages.size()) << "seeds besides the generated ones";
  replay(kFuzzDir / "regressions" / corpus, target);
}

std::vector<std::string> wireParts(const Message& m) {
  std::vector<std::string> parts;
  for (auto& f : encodeMessage(m)) parts.emplace_back(static_cast<const char*>(f.data()), f.size());
  return parts;
}

std::optional<Message> fromParts(const std::vector<std::string>& parts) {
  std::vector<zmq::message_t> frames;
  for (const auto& p : parts) frames.emplace_back(p.data(), p.size());
  DecodeResult r = decodeMessage(std::move(frames));
  return r.ok() ? std::optional<Message>(std::move(*r.message)) : std::nullopt;
}

// Whether some decoder of the list accepts the wire message in `parts`.
template <typename... Decoders>
std::function<bool(const std::vector<std::string>&)> acceptedByOneOf(Decoders... decoders) {
  return [=](const std::vector<std::string>& parts) {
    const auto m = fromParts(parts);
    std::string why;
    return m && ((decoders(*m, &why).has_value()) || ...);
  };
}

TEST(FuzzReplay, CoordinationCorpusAndRegressions) {
  VolunteerProbe probe;
  probe.ram_gb = 15.5;
  probe.cores = 8;
  probe.compute_gflops = 120.25;
  probe.bandwidth_mbps = 940;
  probe.gpus = {GpuFigures{"NVIDIA H100 80GB HBM3", 79.1, 51.2, 400.5, 25, 26}};
  probe.libtorch = "1.13.0";
  MetricsBatch metrics{"node_3", "a1b2", 17, {{{"step", 5}, {"loss", 2.25}}, {{"state", "training"}}}, 2};
  ResultUpload result{"node_3", {{"steps", 120}, {"last_loss", 0.5}}, std::string("PK\x03\x04 stage", 10)};
  Assignment assignment{"node_3", {{"format", 2}, {"name", "node_3"}}, {{"job_id", "j"}}, 2, "stage bytes", std::string("ckpt"), 40};
  const std::vector<Frames> messages = {
      encode(JoinAsk{std::string(64, 'a'), "127.0.0.1:5003", probe, "node_3"}),
      encode(BandwidthProbeMsg{std::string(1024, 'x')}),
      encode(Heartbeat{"node_3", "training", 42}),
      encode(result),
      encode(CheckpointUpload{"node_3", 40, fnv1a64(std::string("ckpt")), "ckpt"}),
      encode(LeavingNotice{"node_3", "its active hours 22:00-07:00 are over"}),
      encode(metrics),
      encode(Accepted{"node_4", "spare", "no stage fits the 0.10 GB it gives", ""}),
      encode(Rejected{"the invite's token is not this run's"}),
      encode(BandwidthAck{1024}),
      encode(assignment),
      encode(PeersUpdate{"node_3", {{"format", 2}, {"name", "node_3"}}}),
      encode(ResultAck{"node_3"}),
      encode(CheckpointAck{"node_3", 40, 30}),
      encode(MetricsAck{"node_3", "a1b2", 19}),
      encode(Finished{"the run is over"}),
      encode(ReachCheck{"0123456789abcdef"}),
      encode(ReachOk{"0123456789abcdef"}),
  };
  checkProtocolCorpus(
      "coordination", messages,
      [](const Frames& f) {
        std::string why;
        return decodeToCoordinator(f, 1 << 20, &why).has_value() || decodeToVolunteer(f, 1 << 20, &why).has_value() ||
               decodeReach(f, &why).has_value();
      },
      &fuzz::coordination);
}

TEST(FuzzReplay, ChunksCorpusAndRegressions) {
  const std::vector<Frames> messages = {encode(ChunkRequest{"node_3", 2, 4096, 65536}),
                                        encode(ChunkPiece{2, 4096, 1 << 20, std::string(256, 'c')}),
                                        encode(ChunkRefused{7, "chunk 7 is not this volunteer's"})};
  checkProtocolCorpus(
      "chunks", messages,
      [](const Frames& f) {
        std::string why;
        return decodeChunkRequest(f, &why).has_value() || decodeChunkReply(f, &why).has_value();
      },
      &fuzz::chunks);
}

TEST(FuzzReplay, PipelineControlCorpusAndRegressions) {
  const ControlOrigin from{"job", "node_1"};
  const std::vector<std::vector<std::string>> messages = {
      wireParts(encode(from, Hello{1, 0, {}, {}})), wireParts(encode(from, Leaving{"handing over", "node_2"})),
      wireParts(encode(from, CheckpointSteps{{10, 20, 30}})), wireParts(encode(from, ResumeAt{30})),
      wireParts(encode(from, Hello{1, 0, HelloId{"0a1b2c3d4e5f6071", 2}, HelloId{"ff00", 1}}))};
  checkProtocolCorpus("pipeline_control", messages,
                      acceptedByOneOf(decodeHello, decodeLeaving, decodeCheckpointSteps, decodeResumeAt),
                      &fuzz::pipelineControl);
}

TEST(FuzzReplay, RingJoinCorpusAndRegressions) {
  Welcome welcome{"node_1", "ring_0", 3, {"node_1", "node_4"}, 40, 2, 0, {}};
  welcome.tensors = {{"fc.weight", torch::arange(6, torch::kFloat32).reshape({2, 3})}, {"fc.bias", torch::ones({2})}};
  welcome.checksum = 0x1234abcd;
  const std::vector<std::vector<std::string>> messages = {
      wireParts(encode(JoinRequest{"node_4", "ring_0"})), wireParts(encode(JoinRequest{"node_4", "ring_0", 77})),
      wireParts(encode(welcome)), wireParts(encode(Closed{"node_1", "ring_0", 77}))};
  checkProtocolCorpus("ring_join", messages, acceptedByOneOf(decodeJoinRequest, decodeWelcome, decodeClosed),
                      &fuzz::ringJoin);
}

TEST(FuzzReplay, CollectiveNoticesCorpusAndRegressions) {
  const std::string tag = collectiveTag("ring_0");
  const std::vector<std::vector<std::string>> messages = {wireParts(encode(AbortNotice{"node_1", tag, 7, "node_2"})),
                                                          wireParts(encode(KeepAliveNotice{"node_1", tag, 7, "node_2"})),
                                                          wireParts(encode(LeaveNotice{"node_1", tag, 7, "node_1"}))};
  checkProtocolCorpus("collective_notices", messages, acceptedByOneOf(decodeAbort, decodeKeepAlive, decodeLeave),
                      &fuzz::collectiveNotices);
}

}  // namespace
}  // namespace cairn
