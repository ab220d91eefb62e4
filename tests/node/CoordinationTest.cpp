// The coordination protocol (node/protocol/Coordination.h) and the volunteer's side of it:
// every message round-trips field for field, each malformed case is refused with its reason,
// invites round-trip and bad ones are BadInput; the reachability responder answers only the
// coordinator's key (real CurveZMQ sockets on 127.0.0.1); and VolunteerSession is driven through
// join → rejected, join → accepted → a malformed assignment, a good assignment written to disk,
// heartbeats and the result upload by a fake coordinator played by the test (a ROUTER behind a
// ZapAuthenticator in AnyKey mode), with no training.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/script.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/Error.h"
#include "core/GpuFigures.h"
#include "core/JsonReader.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/NodeSecurity.h"
#include "node/volunteer/ReachabilityResponder.h"
#include "node/volunteer/VolunteerAssignment.h"
#include "node/volunteer/VolunteerHeartbeats.h"
#include "node/volunteer/VolunteerSession.h"
#include "node/volunteer/VolunteerWorkdir.h"
#include "trainer/Checkpoint.h"
#include "node/protocol/Coordination.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Messages

template <typename T>
T roundTripToCoordinator(const Frames& frames) {
  std::string why;
  auto decoded = decodeToCoordinator(frames, 1 << 20, &why);
  EXPECT_TRUE(decoded.has_value()) << why;
  EXPECT_TRUE(decoded && std::holds_alternative<T>(*decoded));
  return decoded && std::holds_alternative<T>(*decoded) ? std::get<T>(*decoded) : T{};
}
template <typename T>
T roundTripToVolunteer(const Frames& frames) {
  std::string why;
  auto decoded = decodeToVolunteer(frames, 1 << 20, &why);
  EXPECT_TRUE(decoded.has_value()) << why;
  EXPECT_TRUE(decoded && std::holds_alternative<T>(*decoded));
  return decoded && std::holds_alternative<T>(*decoded) ? std::get<T>(*decoded) : T{};
}

TEST(Coordination, MessagesToTheCoordinatorRoundTripFieldForField) {
  JoinAsk join{"a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4", "10.0.0.7:7001",
               {15.5, 8, 123.25, 940.5, {}, "1.13.0"}, "node_3"};
  const JoinAsk j = roundTripToCoordinator<JoinAsk>(encode(join));
  EXPECT_EQ(j.token, join.token);
  EXPECT_EQ(j.advertise, join.advertise);
  EXPECT_EQ(j.name, "node_3");
  EXPECT_EQ(j.probe.ram_gb, 15.5);
  EXPECT_EQ(j.probe.cores, 8);
  EXPECT_EQ(j.probe.compute_gflops, 123.25);
  EXPECT_EQ(j.probe.bandwidth_mbps, 940.5);
  join.name.clear();  // a new volunteer: no name key at all
  EXPECT_EQ(nlohmann::json::parse(encode(join)[0]).count("name"), 0u);
  EXPECT_EQ(roundTripToCoordinator<JoinAsk>(encode(join)).name, "");

  const std::string payload(1000, '\x5a');
  EXPECT_EQ(roundTripToCoordinator<BandwidthProbeMsg>(encode(BandwidthProbeMsg{payload})).payload, payload);

  const Heartbeat h = roundTripToCoordinator<Heartbeat>(encode(Heartbeat{"node_3", "training", 41}));
  EXPECT_EQ(h.name, "node_3");
  EXPECT_EQ(h.state, "training");
  EXPECT_EQ(h.step, 41);
  EXPECT_EQ(roundTripToCoordinator<Heartbeat>(encode(Heartbeat{"n", "waiting", -1})).step, -1);

  const nlohmann::json summary = {{"steps", 12}, {"eval", {{"accuracy", 0.75}}}};
  const std::string weights("\x00\x01\x02\xff", 4);
  const ResultUpload r = roundTripToCoordinator<ResultUpload>(encode(ResultUpload{"node_3", summary, weights}));
  EXPECT_EQ(r.name, "node_3");
  EXPECT_EQ(r.summary, summary);
  EXPECT_EQ(r.trained_stage, weights);

  const std::string file = "checkpoint bytes";
  const CheckpointUpload c = roundTripToCoordinator<CheckpointUpload>(
      encode(CheckpointUpload{"node_3", 200, fnv1a64(file), file}));
  EXPECT_EQ(c.name, "node_3");
  EXPECT_EQ(c.step, 200);
  EXPECT_EQ(c.checksum, fnv1a64(file));
  EXPECT_EQ(c.file, file);

  const LeavingNotice l = roundTripToCoordinator<LeavingNotice>(encode(LeavingNotice{"node_3", "stopped"}));
  EXPECT_EQ(l.name, "node_3");
  EXPECT_EQ(l.reason, "stopped");
}

TEST(Coordination, MessagesToTheVolunteerRoundTripFieldForField) {
  const Accepted a = roundTripToVolunteer<Accepted>(encode(Accepted{"node_9", "spare", "", ""}));
  EXPECT_EQ(a.name, "node_9");
  EXPECT_EQ(a.state, "spare");
  EXPECT_EQ(a.note, "");
  EXPECT_EQ(roundTripToVolunteer<Accepted>(encode(Accepted{"node_9", "spare", "no stage fits", ""})).note,
            "no stage fits");
  EXPECT_EQ(a.reachability, "");  // reachable: no line
  EXPECT_EQ(roundTripToVolunteer<Accepted>(encode(Accepted{"node_9", "spare", "", "dial-out only: …"}))
                .reachability,
            "dial-out only: …");
  EXPECT_EQ(roundTripToVolunteer<Rejected>(encode(Rejected{"wrong token"})).reason, "wrong token");
  EXPECT_FALSE(roundTripToVolunteer<Rejected>(encode(Rejected{"wrong token"})).node_taken);
  EXPECT_TRUE(roundTripToVolunteer<Rejected>(encode(Rejected{"node_1 was given to another", true})).node_taken);
  // node_taken is absent when false (what older volunteers read), and must be a bool when present.
  EXPECT_EQ(nlohmann::json::parse(encode(Rejected{"wrong token"})[0]).count("node_taken"), 0u);
  std::string bad_flag;
  EXPECT_FALSE(decodeToVolunteer({R"({"protocol":1,"type":"rejected","reason":"x","node_taken":1})"}, 1024, &bad_flag));
  EXPECT_NE(bad_flag.find("node_taken"), std::string::npos) << bad_flag;
  EXPECT_EQ(roundTripToVolunteer<BandwidthAck>(encode(BandwidthAck{8 << 20})).bytes, 8 << 20);

  Assignment fresh;
  fresh.name = "node_9";
  fresh.node = {{"name", "node_9"}, {"cluster", 1}};
  fresh.job = {{"job_id", "j"}};
  fresh.num_clusters = 3;
  fresh.stage = std::string("stage\0bytes", 11);
  const Assignment f = roundTripToVolunteer<Assignment>(encode(fresh));
  EXPECT_EQ(f.name, "node_9");
  EXPECT_EQ(f.node, fresh.node);
  EXPECT_EQ(f.job, fresh.job);
  EXPECT_EQ(f.num_clusters, 3);
  EXPECT_EQ(f.stage, fresh.stage);
  EXPECT_FALSE(f.checkpoint.has_value());
  EXPECT_EQ(f.checkpoint_step, -1);
  Assignment resume = fresh;
  resume.checkpoint = "ckpt";
  resume.checkpoint_step = 70;
  const Assignment r = roundTripToVolunteer<Assignment>(encode(resume));
  ASSERT_TRUE(r.checkpoint.has_value());
  EXPECT_EQ(*r.checkpoint, "ckpt");
  EXPECT_EQ(r.checkpoint_step, 70);
  EXPECT_EQ(r.stage, fresh.stage);

  const PeersUpdate p = roundTripToVolunteer<PeersUpdate>(encode(PeersUpdate{"node_9", {{"a", 1}}}));
  EXPECT_EQ(p.name, "node_9");
  EXPECT_EQ(p.node, (nlohmann::json{{"a", 1}}));
  EXPECT_EQ(roundTripToVolunteer<ResultAck>(encode(ResultAck{"node_9"})).name, "node_9");
  const CheckpointAck ca = roundTripToVolunteer<CheckpointAck>(encode(CheckpointAck{"node_9", 40}));
  EXPECT_EQ(ca.name, "node_9");
  EXPECT_EQ(ca.step, 40);
  EXPECT_EQ(ca.keep_from, -1);  // not said
  const CheckpointAck kf = roundTripToVolunteer<CheckpointAck>(encode(CheckpointAck{"node_9", 40, 20}));
  EXPECT_EQ(kf.keep_from, 20);
  EXPECT_EQ(roundTripToVolunteer<Finished>(encode(Finished{"done"})).reason, "done");

  std::string why;
  auto check = decodeReach(encode(ReachCheck{"n0nce"}), &why);
  ASSERT_TRUE(check && std::holds_alternative<ReachCheck>(*check)) << why;
  EXPECT_EQ(std::get<ReachCheck>(*check).nonce, "n0nce");
  auto ok = decodeReach(encode(ReachOk{"n0nce"}), &why);
  ASSERT_TRUE(ok && std::holds_alternative<ReachOk>(*ok)) << why;
  EXPECT_EQ(std::get<ReachOk>(*ok).nonce, "n0nce");
}

// A header with `changes` applied to a well-formed message's header.
Frames edited(Frames frames, const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json h = nlohmann::json::parse(frames[0]);
  change(h);
  frames[0] = h.dump();
  return frames;
}

std::string whyToCoordinator(const Frames& frames, size_t limit = 1 << 20) {
  std::string why;
  EXPECT_FALSE(decodeToCoordinator(frames, limit, &why).has_value());
  return why;
}
std::string whyToVolunteer(const Frames& frames, size_t limit = 1 << 20) {
  std::string why;
  EXPECT_FALSE(decodeToVolunteer(frames, limit, &why).has_value());
  return why;
}

TEST(Coordination, MalformedMessagesAreRefusedWithTheirReason) {
  const Frames heartbeat = encode(Heartbeat{"node_1", "waiting", -1});
  EXPECT_EQ(whyToCoordinator({"{not json"}), "header is not a JSON object");
  EXPECT_EQ(whyToCoordinator({}), "empty message");
  EXPECT_NE(whyToCoordinator(edited(heartbeat, [](auto& h) { h["protocol"] = 2; }))
                .find("\"protocol\" must be 1"),
            std::string::npos);
  EXPECT_NE(whyToCoordinator(edited(heartbeat, [](auto& h) { h.erase("protocol"); }))
                .find("\"protocol\" must be 1"),
            std::string::npos);
  EXPECT_EQ(whyToCoordinator(edited(heartbeat, [](auto& h) { h.erase("type"); })),
            "header has no string \"type\"");
  EXPECT_EQ(whyToCoordinator(edited(heartbeat, [](auto& h) { h.erase("name"); })),
            "heartbeat: \"name\" must be a string");
  EXPECT_EQ(whyToCoordinator(edited(heartbeat, [](auto& h) { h["step"] = "seven"; })),
            "heartbeat: \"step\" must be an integer");
  EXPECT_EQ(whyToCoordinator(edited(heartbeat, [](auto& h) { h["step"] = -2; })),
            "heartbeat: \"step\" must be an integer in [-1, 9223372036854775807]");
  EXPECT_EQ(whyToCoordinator(edited(heartbeat, [](auto& h) { h["type"] = "hello"; })),
            "unknown message type \"hello\" for the coordinator");
  const Frames join = encode(JoinAsk{"aa", "h:1", {1, 2, 3, 4, {}, "1.13.0"}, ""});
  EXPECT_EQ(whyToCoordinator(edited(join, [](auto& h) { h["probe"]["ram_gb"] = "lots"; })),
            "join: probe: \"ram_gb\" must be a finite number");
  EXPECT_EQ(whyToCoordinator(edited(join, [](auto& h) { h.erase("probe"); })),
            "join: \"probe\" must be an object");
  EXPECT_EQ(whyToCoordinator(edited(join, [](auto& h) { h["token"] = ""; })),
            "join: \"token\" must be a non-empty string");

  // Attachment counts.
  Frames result = encode(ResultUpload{"node_1", {{"steps", 1}}, "w"});
  result.pop_back();
  EXPECT_EQ(whyToCoordinator(result), "result: 0 attachments, expected 1");
  Frames extra = heartbeat;
  extra.push_back("x");
  EXPECT_EQ(whyToCoordinator(extra), "heartbeat: 1 attachments, expected 0");
  Assignment resume;
  resume.name = "n";
  resume.node = resume.job = nlohmann::json::object();
  resume.stage = "s";
  resume.checkpoint = "c";
  Frames short_resume = encode(resume);
  short_resume.pop_back();
  EXPECT_EQ(whyToVolunteer(short_resume), "assignment: 1 attachments, expected 2");

  // Oversized attachment, bad checksum, bandwidth bytes that do not match.
  EXPECT_EQ(whyToCoordinator(encode(BandwidthProbeMsg{std::string(11, 'x')}), 10),
            "bandwidth: attachment of 11 bytes exceeds the limit of 10");
  EXPECT_EQ(whyToCoordinator(encode(CheckpointUpload{"node_1", 5, fnv1a64("abc") + 1, "abc"})),
            "checkpoint: the attachment does not match its checksum");
  EXPECT_EQ(whyToCoordinator(edited(encode(BandwidthProbeMsg{"abcd"}), [](auto& h) { h["bytes"] = 5; })),
            "bandwidth: \"bytes\" says 5 but the attachment has 4");

  // The other direction, and reachability messages.
  EXPECT_EQ(whyToVolunteer(edited(encode(Accepted{"n", "spare", "", ""}), [](auto& h) { h["name"] = 7; })),
            "accepted: \"name\" must be a string");
  EXPECT_EQ(whyToVolunteer(edited(encode(Accepted{"n", "spare", "", ""}), [](auto& h) { h["note"] = 7; })),
            "accepted: \"note\" must be a string");
  EXPECT_EQ(whyToVolunteer(encode(Heartbeat{"n", "waiting", 1})),
            "unknown message type \"heartbeat\" for a volunteer");
  EXPECT_EQ(whyToVolunteer(edited(encode(CheckpointAck{"n", 10}), [](auto& h) { h["step"] = -1; })),
            "checkpoint_ack: \"step\" must be an integer in [0, 9223372036854775807]");
  EXPECT_EQ(whyToVolunteer(edited(encode(CheckpointAck{"n", 10}), [](auto& h) { h["keep_from"] = -3; })),
            "checkpoint_ack: \"keep_from\" must be an integer in [0, 9223372036854775807]");
  EXPECT_EQ(whyToVolunteer(edited(encode(CheckpointAck{"n", 10}), [](auto& h) { h.erase("name"); })),
            "checkpoint_ack: \"name\" must be a string");
  std::string why;
  EXPECT_FALSE(decodeReach(encode(Accepted{"n", "spare", "", ""}), &why).has_value());
  EXPECT_EQ(why, "unknown message type \"accepted\" for a reachability check");
  EXPECT_FALSE(decodeReach(edited(encode(ReachCheck{"n"}), [](auto& h) { h.erase("nonce"); }), &why));
  EXPECT_EQ(why, "reach: \"nonce\" must be a string");
}

// ---------------------------------------------------------------------------------------------
// The join's probe: GPUs (core/GpuFigures.h) and the libtorch version (VolunteerProbeCodec.h)

GpuFigures h100() {
  return {"NVIDIA H100 80GB HBM3", 79.1, 51.5, 612.25, 25.5, 24.75};
}

TEST(Coordination, TheJoinProbeCarriesGpusAndTheLibtorchVersion) {
  EXPECT_EQ(VolunteerProbe{}.libtorch, "1.13.0");  // the default: what cairn was built against so far
  JoinAsk join{"a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4", "10.0.0.7:7001",
               {15.5, 8, 123.25, 940.5, {}, "1.13.0"}, ""};
  join.probe.gpus = {h100(), {"NVIDIA GeForce RTX 4090", 25.3, 80.0, 160.0, 21.0, 20.5}};
  join.probe.libtorch = "2.11.0";
  const JoinAsk j = roundTripToCoordinator<JoinAsk>(encode(join));
  EXPECT_EQ(j.probe.libtorch, "2.11.0");
  ASSERT_EQ(j.probe.gpus.size(), 2u);
  EXPECT_EQ(gpuFiguresToJson(j.probe.gpus), gpuFiguresToJson(join.probe.gpus));
  EXPECT_EQ(j.probe.gpus[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j.probe.gpus[0].bf16_tflops, 612.25);
  EXPECT_EQ(j.probe.gpus[1].d2h_gb_per_s, 20.5);
  // The header names them as docs/PROTOCOL.md says.
  const nlohmann::json probe = nlohmann::json::parse(encode(join)[0])["probe"];
  EXPECT_EQ(probe["libtorch"], "2.11.0");
  EXPECT_EQ(probe["gpus"][0]["memory_gb"], 79.1);
  // No GPU: an empty list, and back.
  join.probe.gpus.clear();
  EXPECT_EQ(nlohmann::json::parse(encode(join)[0])["probe"]["gpus"], nlohmann::json::array());
  EXPECT_TRUE(roundTripToCoordinator<JoinAsk>(encode(join)).probe.gpus.empty());
  // A volunteer from before these keys: no GPU, libtorch 1.13.0.
  const JoinAsk old = roundTripToCoordinator<JoinAsk>(edited(encode(join), [](auto& h) {
    h["probe"].erase("gpus");
    h["probe"].erase("libtorch");
  }));
  EXPECT_TRUE(old.probe.gpus.empty());
  EXPECT_EQ(old.probe.libtorch, "1.13.0");
  EXPECT_EQ(describeGpus({}), "none");
  EXPECT_EQ(describeGpus({h100()}),
            "NVIDIA H100 80GB HBM3 (79.1 GB, 51.5 fp32 / 612.2 bf16 TFLOP/s, 25.5/24.8 GB/s h2d/d2h)");
}

TEST(Coordination, HostileGpuFiguresAndLibtorchVersionsAreRefusedNamingTheKey) {
  JoinAsk ask{"aa", "h:1", {1, 2, 3, 4, {}, "1.13.0"}, ""};
  ask.probe.gpus = {h100()};
  const Frames join = encode(ask);
  auto gpu = [&](const std::function<void(nlohmann::json&)>& change) {
    return whyToCoordinator(edited(join, [&](auto& h) { change(h["probe"]["gpus"]); }));
  };
  auto says = [](const std::string& why, std::initializer_list<const char*> parts) {
    for (const char* part : parts)
      EXPECT_NE(why.find(part), std::string::npos) << "\"" << part << "\" not in: " << why;
  };
  // Beyond the plausible bounds: the key, the GPU and the bound are named.
  says(gpu([](auto& g) { g[0]["bf16_tflops"] = 5000; }),
       {"join: probe: gpus[0]", "bf16_tflops", "at most 2000 TFLOP/s"});
  says(gpu([](auto& g) { g[0]["memory_gb"] = 500; }), {"gpus[0]", "memory_gb", "at most 400 GB"});
  says(gpu([](auto& g) { g[0]["fp32_tflops"] = 1e300; }), {"fp32_tflops", "at most 1000 TFLOP/s"});
  says(gpu([](auto& g) { g[0]["h2d_gb_per_s"] = 5000; }), {"h2d_gb_per_s", "at most 1000 GB/s"});
  // Negative, zero, wrong types, unknown keys, too many, too long a name.
  says(gpu([](auto& g) { g[0]["fp32_tflops"] = -3; }), {"gpus[0]", "fp32_tflops"});
  says(gpu([](auto& g) { g[0]["d2h_gb_per_s"] = 0; }), {"d2h_gb_per_s"});
  says(gpu([](auto& g) { g[0]["memory_gb"] = "lots"; }), {"memory_gb"});
  says(gpu([](auto& g) { g[0]["name"] = 7; }), {"gpus[0]", "name"});
  says(gpu([](auto& g) { g[0]["name"] = std::string(300, 'x'); }), {"name", "1 to 256 bytes"});
  says(gpu([](auto& g) { g[0].erase("bf16_tflops"); }), {"bf16_tflops"});
  says(gpu([](auto& g) { g[0]["fp64_tflops"] = 1; }), {"fp64_tflops"});
  says(gpu([](auto& g) { g.push_back(5); }), {"gpus[1]", "must be an object"});
  says(gpu([](auto& g) { g = "H100"; }), {"join: probe: gpus", "must be an array"});
  says(gpu([](auto& g) {
         g = nlohmann::json::array();
         for (int i = 0; i < 65; ++i) g.push_back(gpuFiguresToJson({h100()})[0]);
       }),
       {"65 GPUs", "at most 64"});
  // The libtorch version: digits.digits.digits, bounded.
  for (const nlohmann::json& bad : std::vector<nlohmann::json>{
           "2.11", "2.11.0+cu128", "v2.11.0", " 2.11.0", "2.11.0.1", "2..0", "", "a.b.c",
           "1234567.0.0", std::string(40, '1'), 211, nullptr, nlohmann::json::array()}) {
    const std::string why =
        whyToCoordinator(edited(join, [&](auto& h) { h["probe"]["libtorch"] = bad; }));
    says(why, {"join: probe: \"libtorch\" must be"});
  }
  // A hostile message is refused, never thrown.
  std::string why;
  EXPECT_NO_THROW(decodeToCoordinator(edited(join, [](auto& h) { h["probe"]["gpus"][0] = nullptr; }),
                                      1 << 20, &why));
}

// ---------------------------------------------------------------------------------------------
// Invites

std::string hexOf(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += {digits[c >> 4], digits[c & 15]};
  return out;
}

void expectBadInvite(const std::string& text, const std::string& says) {
  try {
    parseInvite(text);
    ADD_FAILURE() << "accepted " << text;
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(Coordination, InvitesRoundTripAndBadOnesAreBadInput) {
  Invite invite;
  invite.host = "coordinator.example.org";
  invite.port = 7000;
  invite.coordinator_key = generateCurveKeyPair().public_key;
  invite.token = "0123456789abcdef0123456789abcdef";
  const std::string text = formatInvite(invite);
  EXPECT_EQ(text, "cairn-invite:1:coordinator.example.org:7000:" + hexOf(invite.coordinator_key) +
                      ":" + invite.token);
  const Invite back = parseInvite(text);
  EXPECT_EQ(back.host, invite.host);
  EXPECT_EQ(back.port, 7000);
  EXPECT_EQ(back.coordinator_key, invite.coordinator_key);
  EXPECT_EQ(back.token, invite.token);
  EXPECT_EQ(back.address(), "coordinator.example.org:7000");

  const std::string key = hexOf(invite.coordinator_key), token = invite.token;
  expectBadInvite("cairn-invite:2:h:7000:" + key + ":" + token, "does not start with cairn-invite:1:");
  expectBadInvite("h:7000:" + key + ":" + token, "does not start with");
  expectBadInvite("cairn-invite:1:h:0:" + key + ":" + token, "not a number in 1..65535");
  expectBadInvite("cairn-invite:1:h:65536:" + key + ":" + token, "not a number in 1..65535");
  expectBadInvite("cairn-invite:1:h:seven:" + key + ":" + token, "not a number in 1..65535");
  expectBadInvite("cairn-invite:1:7000:" + key + ":" + token, "has no host:port");
  expectBadInvite("cairn-invite:1:h:7000:" + key.substr(2) + ":" + token, "not 80 hex digits");
  expectBadInvite("cairn-invite:1:h:7000:" + key.substr(0, 78) + "zz:" + token, "not 80 hex digits");
  // 40 bytes that are not Z85 characters ('~' is outside the alphabet).
  expectBadInvite("cairn-invite:1:h:7000:" + hexOf(std::string(40, '~')) + ":" + token,
                  "not a CURVE public key");
  expectBadInvite("cairn-invite:1:h:7000:" + key + ":" + token.substr(1), "not 32 to 128 hex digits");
  expectBadInvite("cairn-invite:1:h:7000:" + key + ":" + token.substr(1) + "g",
                  "not 32 to 128 hex digits");
  expectBadInvite("cairn-invite:1:h:7000:" + key + ":" + std::string(130, 'a'),
                  "not 32 to 128 hex digits");
}

// ---------------------------------------------------------------------------------------------
// Sockets: the reachability responder and a fake coordinator

constexpr size_t kLimit = 64 << 20;

// Polls `condition` until it holds or 10 s pass (what the test waits for is an event another
// thread causes; the deadline only keeps a broken build from hanging).
bool eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

std::optional<ReachOk> reachOnce(zmq::socket_t& dealer, const std::string& nonce,
                                 std::chrono::milliseconds wait) {
  sendFrames(dealer, encode(ReachCheck{nonce}));
  auto frames = recvFrames(dealer, wait);
  if (!frames) return std::nullopt;
  std::string why;
  auto reply = decodeReach(*frames, &why);
  if (!reply || !std::holds_alternative<ReachOk>(*reply)) return std::nullopt;
  return std::get<ReachOk>(*reply);
}

TEST(ReachabilityResponder, AnswersTheCoordinatorKeyOnlyAndReleasesItsPort) {
  const CurveKeyPair volunteer = generateCurveKeyPair(), coordinator = generateCurveKeyPair(),
                     stranger = generateCurveKeyPair();
  zmq::context_t volunteer_context;
  ReachabilityResponder responder(volunteer_context, volunteer, coordinator.public_key, "127.0.0.1:0");
  const std::string address = responder.bound();
  ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  ASSERT_NE(address, "127.0.0.1:0");

  // Another key: the handshake is refused (ZAP), nothing comes back.
  zmq::context_t stranger_context;
  zmq::socket_t impostor = coordinationClient(stranger_context, zmq::socket_type::dealer, stranger,
                                              volunteer.public_key, address, 1 << 16);
  sendFrames(impostor, encode(ReachCheck{"impostor"}));
  ASSERT_TRUE(eventually([&] { return responder.refused() >= 1; }));
  EXPECT_FALSE(recvFrames(impostor, 200ms).has_value());

  // The coordinator's key: a message that is not a reach check is dropped; the check is answered
  // with its nonce (the same connection, in order: the drop is counted before the answer comes).
  zmq::context_t coordinator_context;
  zmq::socket_t dealer = coordinationClient(coordinator_context, zmq::socket_type::dealer,
                                            coordinator, volunteer.public_key, address, 1 << 16);
  sendFrames(dealer, encode(Heartbeat{"x", "waiting", -1}));
  const auto ok = reachOnce(dealer, "nonce-42", 10s);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->nonce, "nonce-42");
  EXPECT_EQ(responder.answered(), 1u);
  EXPECT_EQ(responder.dropped(), 1u);
  EXPECT_EQ(responder.answered(), 1u) << "the impostor's check was never answered";

  // stop() releases the port: a new listener binds the very address at once.
  responder.stop();
  zmq::context_t next_context;
  zmq::socket_t next(next_context, zmq::socket_type::pull);
  next.set(zmq::sockopt::linger, 0);
  EXPECT_NO_THROW(next.bind("tcp://" + address));
}

// The coordinator a test plays: a ROUTER behind a ZapAuthenticator that admits any key.
struct FakeCoordinator {
  CurveKeyPair keys = generateCurveKeyPair();
  zmq::context_t context;
  ZapAuthenticator zap{context, ZapAuthenticator::AnyKey{}};
  std::string bound;
  zmq::socket_t router = coordinationServer(context, keys, "127.0.0.1:0", kLimit, &bound);

  Invite invite() const {
    Invite i;
    const auto colon = bound.rfind(':');
    i.host = bound.substr(0, colon);
    i.port = std::stoi(bound.substr(colon + 1));
    i.coordinator_key = keys.public_key;
    i.token = "00112233445566778899aabbccddeeff";
    return i;
  }
  // The next message, decoded (test failure when none comes within 10 s or it is malformed).
  std::pair<Routed, ToCoordinator> next() {
    auto in = recvRouted(router, 10s);
    if (!in) throw std::runtime_error("the fake coordinator received nothing within 10 s");
    std::string why;
    auto m = decodeToCoordinator(in->frames, kLimit, &why);
    if (!m) throw std::runtime_error("malformed message to the coordinator: " + why);
    return {*in, *m};
  }
  template <typename T>
  std::pair<Routed, T> expect() {
    for (;;) {
      auto [routed, m] = next();
      if (std::holds_alternative<T>(m)) return {routed, std::get<T>(m)};
      if (!std::holds_alternative<Heartbeat>(m))  // heartbeats may come between anything
        throw std::runtime_error("the fake coordinator got an unexpected message");
    }
  }
  void reply(const Routed& to, const Frames& frames) { sendRouted(router, to.routing_id, frames); }
  // bandwidth → bandwidth_ack, then the join (after checking the volunteer answers its
  // reachability check at the advertised address with the key it joined with).
  std::pair<Routed, JoinAsk> acceptProbeAndJoin() {
    auto [probe_from, probe] = expect<BandwidthProbeMsg>();
    reply(probe_from, encode(BandwidthAck{int64_t(probe.payload.size())}));
    auto [join_from, join] = expect<JoinAsk>();
    zmq::socket_t check = coordinationClient(context, zmq::socket_type::dealer, keys,
                                             join_from.user_id, join.advertise, 1 << 16);
    const auto ok = reachOnce(check, "reach-" + join_from.user_id.substr(0, 8), 10s);
    if (!ok || ok->nonce != "reach-" + join_from.user_id.substr(0, 8))
      throw std::runtime_error("the volunteer did not answer the reachability check");
    return {join_from, join};
  }
};

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("cairn_coordination_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(std::random_device{}())))
               .string();
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Tests stop their volunteer through `abandon` when they end early (a failed expectation), so that
// no volunteer thread outlives its test waiting for an assignment that will not come.
VolunteerConfig configFor(const FakeCoordinator& coordinator, const std::string& workdir,
                          std::atomic<bool>* abandon) {
  VolunteerConfig c;
  c.stop_requested = [abandon] { return abandon->load(); };
  c.invite = coordinator.invite();
  c.listen = "127.0.0.1:0";  // advertise: the bound address
  c.workdir = workdir;
  c.coordinator_timeout = 10s;
  c.heartbeat_interval = 50ms;
  c.probe_megabytes = 1;
  return c;
}

const VolunteerProbe kMachine{7.5, 4, 55.5, 0, {}, "1.13.0"};

// Runs `body` on another thread (the volunteer's); join() rethrows what it threw. Destroyed
// without join() (the test failed early), it sets `abandon` first.
class VolunteerThread {
 public:
  VolunteerThread(std::atomic<bool>& abandon, std::function<void()> body)
      : abandon_(abandon), thread_([this, body] {
          try {
            body();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~VolunteerThread() {
    if (!thread_.joinable()) return;
    abandon_ = true;
    thread_.join();
  }
  void join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool>& abandon_;
  std::exception_ptr error_;
  std::thread thread_;
};

TEST(VolunteerSession, ARejectedJoinIsBadInputWithTheCoordinatorsReason) {
  FakeCoordinator coordinator;
  TempDir dir;
  std::atomic<bool> abandon{false};
  const std::string workdir = dir.path + "/volunteer";
  VolunteerThread volunteer(abandon, [&] {
    VolunteerSession session(configFor(coordinator, workdir, &abandon));
    session.join(kMachine);
  });
  auto [from, join] = coordinator.acceptProbeAndJoin();
  EXPECT_EQ(join.token, coordinator.invite().token);
  EXPECT_EQ(join.name, "");
  EXPECT_EQ(join.probe.ram_gb, 7.5);
  EXPECT_EQ(join.probe.cores, 4);
  EXPECT_EQ(join.probe.compute_gflops, 55.5);
  EXPECT_GT(join.probe.bandwidth_mbps, 0);
  coordinator.reply(from, encode(Rejected{"the token is not this run's"}));
  try {
    volunteer.join();
    FAIL() << "the join was not refused";
  } catch (const BadInput& e) {
    EXPECT_STREQ(e.what(), "the coordinator refused to join: the token is not this run's");
  }
  // The key pair was made in the work folder (0600) and is the one the coordinator saw.
  const CurveKeyPair identity = readKeyFile(workdir + "/identity.key");
  EXPECT_EQ(identity.public_key, from.user_id);
  struct stat st {};
  ASSERT_EQ(::stat((workdir + "/identity.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(fs::exists(workdir + "/membership.json"));
}

TEST(VolunteerSession, AWrongCoordinatorKeyIsPeerLostSayingSo) {
  FakeCoordinator coordinator;
  TempDir dir;
  std::atomic<bool> abandon{false};
  VolunteerConfig config = configFor(coordinator, dir.path + "/v", &abandon);
  config.invite.coordinator_key = generateCurveKeyPair().public_key;  // not the coordinator's
  config.coordinator_timeout = 300ms;
  VolunteerSession session(config);
  try {
    session.join(kMachine);
    FAIL() << "joined a coordinator with the wrong key";
  } catch (const PeerLost& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the coordinator at " + coordinator.bound), std::string::npos) << what;
    EXPECT_NE(what.find("did not answer"), std::string::npos) << what;
    EXPECT_NE(what.find("wrong coordinator key"), std::string::npos) << what;
  }
  EXPECT_FALSE(recvRouted(coordinator.router, 0ms).has_value());
}

// A one-stage plan for node `name` at `address`, and a real TorchScript stage (forward: 2x).
std::string doublingStage() {
  torch::jit::Module m("Doubling");
  m.define("def forward(self, x):\n  return x * 2.0\n");
  std::ostringstream bytes;
  m.save(bytes);
  return bytes.str();
}
Assignment goodAssignment(const std::string& name, const std::string& address) {
  NodeSpec node;
  node.name = name;
  node.job_id = "job-7";
  node.address = address;
  node.inputs = {{"x", "tensor", "float32", {1, 4}}};
  node.outputs = {{"y", "tensor", "float32", {1, 4}}};
  JobSpec job;
  job.job_id = "job-7";
  job.data.location = "/nonexistent/data";
  job.data.format = "idx";
  Assignment a;
  a.name = name;
  a.node = toJson(node);
  a.job = toJson(job);
  a.num_clusters = 2;
  a.stage = doublingStage();
  return a;
}

TEST(VolunteerSession, AMalformedAssignmentIsBadInputNamingTheCoordinator) {
  FakeCoordinator coordinator;
  TempDir dir;
  std::atomic<bool> abandon{false};
  const std::string workdir = dir.path + "/volunteer";
  VolunteerThread volunteer(abandon, [&] {
    VolunteerSession session(configFor(coordinator, workdir, &abandon));
    ASSERT_TRUE(session.join(kMachine).has_value());
    EXPECT_EQ(session.name(), "node_4");
    session.waitForAssignment();
  });
  auto [from, join] = coordinator.acceptProbeAndJoin();
  coordinator.reply(from, encode(Accepted{"node_4", "spare", "", ""}));
  auto [beat_from, beat] = coordinator.expect<Heartbeat>();
  EXPECT_EQ(beat.name, "node_4");
  EXPECT_EQ(beat.state, "waiting");
  EXPECT_EQ(beat.step, -1);
  Assignment bad = goodAssignment("node_4", join.advertise);
  bad.node.erase("inputs");
  coordinator.reply(beat_from, encode(bad));
  // The volunteer says why it leaves before it gives up.
  auto [leaving_from, leaving] = coordinator.expect<LeavingNotice>();
  EXPECT_EQ(leaving.name, "node_4");
  EXPECT_EQ(leaving.reason.rfind("invalid assignment: ", 0), 0u) << leaving.reason;
  try {
    volunteer.join();
    FAIL() << "a malformed assignment was taken";
  } catch (const BadInput& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the coordinator at " + coordinator.bound + " (key " +
                        coordinator.keys.public_key + ")"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("coordinator assignment: node.json"), std::string::npos) << what;
    EXPECT_NE(what.find("inputs"), std::string::npos) << what;
  }
  EXPECT_FALSE(fs::exists(workdir + "/node_data")) << "nothing is written from a bad assignment";
  // It said it leaves, so it gave its name up: a later join comes back without asking for it.
  EXPECT_FALSE(fs::exists(workdir + "/membership.json"));
}

std::string errorOf(const Assignment& a, const std::string& accepted_as, const std::string& key) {
  try {
    checkAssignment(a, accepted_as, key, "the coordinator at c:1 (key K)");
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST(VolunteerSession, EachWrongAssignmentIsRefusedWithWhatIsWrong) {
  const std::string own = generateCurveKeyPair().public_key;
  const Assignment good = goodAssignment("node_4", "127.0.0.1:7001");
  EXPECT_EQ(errorOf(good, "node_4", own), "");
  Assignment a = good;
  EXPECT_NE(errorOf(a, "node_5", own).find("it is for \"node_4\" but the coordinator accepted this "
                                           "volunteer as \"node_5\""),
            std::string::npos);
  a = good;
  a.job.erase("job_id");
  EXPECT_NE(errorOf(a, "node_4", own).find("coordinator assignment: job.json"), std::string::npos);
  a = good;
  a.node["job_id"] = "other";
  EXPECT_NE(errorOf(a, "node_4", own).find("job_id \"other\" differs"), std::string::npos);
  a = good;
  a.node["extra"]["public_key"] = generateCurveKeyPair().public_key;
  EXPECT_NE(errorOf(a, "node_4", own).find("not this volunteer's key " + own), std::string::npos);
  a = good;
  a.stage = "not a zip file";
  EXPECT_NE(errorOf(a, "node_4", own).find("does not load as TorchScript"), std::string::npos);
  a = good;
  a.checkpoint = "ckpt";
  a.checkpoint_step = -1;
  EXPECT_NE(errorOf(a, "node_4", own).find("carries a checkpoint but no checkpoint_step"),
            std::string::npos);
  a = goodAssignment("../evil", "127.0.0.1:7001");
  EXPECT_NE(errorOf(a, "../evil", own).find("must use only letters"), std::string::npos);
  for (const auto& e : {errorOf(a, "node_5", own), errorOf(a, "../evil", own)})
    EXPECT_EQ(e.rfind("the coordinator at c:1 (key K) sent an assignment this volunteer cannot use: ", 0),
              0u)
        << e;
}

TEST(VolunteerSession, AnAssignmentIsWrittenThenHeartbeatsAndResultsGoToTheCoordinator) {
  FakeCoordinator coordinator;
  TempDir dir;
  std::atomic<bool> abandon{false};
  const std::string workdir = dir.path + "/volunteer";
  const std::string weights = dir.path + "/trained_stage.pt";
  {
    std::ofstream(weights, std::ios::binary) << "trained weights";
  }
  const nlohmann::json summary = {{"steps", 3}, {"last_loss", 0.5}};
  AssignmentWait wait;
  std::string listen_bound, public_key;
  std::atomic<bool> stop_heartbeats{false};
  bool uploaded = false;
  VolunteerThread volunteer(abandon, [&] {
    VolunteerSession session(configFor(coordinator, workdir, &abandon));
    ASSERT_TRUE(session.join(kMachine).has_value());
    public_key = session.publicKey();
    listen_bound = session.listenBound();
    wait = session.waitForAssignment();
    {
      auto heartbeats = session.trainingHeartbeats();
      ASSERT_TRUE(eventually([&] { return stop_heartbeats.load(); }));
      EXPECT_TRUE(eventually([&] { return heartbeats->sent() >= 1; }));  // counted after the send
    }
    uploaded = session.uploadResult(summary, weights);
  });
  auto [from, join] = coordinator.acceptProbeAndJoin();
  coordinator.reply(from, encode(Accepted{"node_4", "spare", "", ""}));
  auto [beat_from, beat] = coordinator.expect<Heartbeat>();
  coordinator.reply(beat_from, encode(goodAssignment("node_4", join.advertise)));
  // Training heartbeats come from another connection (the heartbeat thread's own socket).
  for (;;) {
    auto [training_from, training] = coordinator.expect<Heartbeat>();
    if (training.state != "training") continue;
    EXPECT_EQ(training.name, "node_4");
    EXPECT_EQ(training_from.user_id, from.user_id);
    break;
  }
  stop_heartbeats = true;
  auto [result_from, result] = coordinator.expect<ResultUpload>();
  EXPECT_EQ(result.name, "node_4");
  EXPECT_EQ(result.summary, summary);
  EXPECT_EQ(result.trained_stage, "trained weights");
  coordinator.reply(result_from, encode(ResultAck{"node_4"}));
  volunteer.join();
  EXPECT_TRUE(uploaded);

  ASSERT_EQ(wait.end, AssignmentWait::End::kAssigned);
  EXPECT_EQ(wait.name, "node_4");
  EXPECT_EQ(wait.node_data, workdir + "/node_data");
  // Accepted volunteers remember the coordinator and their name.
  const nlohmann::json membership = readJsonFile(workdir + "/membership.json");
  EXPECT_EQ(membership["name"], "node_4");
  EXPECT_EQ(membership["coordinator"], coordinator.bound);
  EXPECT_EQ(membership["coordinator_key"], coordinator.keys.public_key);
  // What runProvider reads, as the static flow has it.
  const NodeSpec node = readNodeSpec(nodeSpecPath(wait.node_data, "node_4"));
  EXPECT_EQ(node.address, listen_bound);
  EXPECT_EQ(node.extra["num_clusters"], 2);
  EXPECT_EQ(node.extra["public_key"], public_key);
  EXPECT_EQ(readJobSpec(jobSpecPath(wait.node_data)).job_id, "job-7");
  const std::string node_dir = nodeDirectory(wait.node_data, "node_4");
  torch::jit::Module stage = torch::jit::load(node_dir + "/stage.pt");
  EXPECT_TRUE(torch::equal(stage.forward({torch::ones({1, 4})}).toTensor(), torch::full({1, 4}, 2.0)));
  const CurveKeyPair secret = readKeyFile(node_dir + "/secret.key");  // refuses a readable file
  EXPECT_EQ(secret.public_key, public_key);
  EXPECT_EQ(secret.secret_key, readKeyFile(workdir + "/identity.key").secret_key);
  EXPECT_NO_THROW(curveOptionsForNode(node, nodeSpecPath(wait.node_data, "node_4"),
                                      node_dir + "/secret.key"));
  // The responder is gone: its port is free for the training transport.
  zmq::context_t next_context;
  zmq::socket_t next(next_context, zmq::socket_type::pull);
  next.set(zmq::sockopt::linger, 0);
  EXPECT_NO_THROW(next.bind("tcp://" + listen_bound));
}

TEST(VolunteerSession, ARestartedVolunteerAsksForItsNameWithTheSameKey) {
  FakeCoordinator coordinator;
  TempDir dir;
  std::atomic<bool> abandon{false};
  const std::string workdir = dir.path + "/volunteer";
  std::string first_key;
  {
    VolunteerThread volunteer(abandon, [&] {
      VolunteerSession session(configFor(coordinator, workdir, &abandon));
      session.join(kMachine);
      first_key = session.publicKey();
    });
    auto [from, join] = coordinator.acceptProbeAndJoin();
    EXPECT_EQ(join.name, "");
    coordinator.reply(from, encode(Accepted{"node_8", "spare", "", ""}));
    volunteer.join();
  }
  VolunteerThread again(abandon, [&] {
    VolunteerSession session(configFor(coordinator, workdir, &abandon));
    EXPECT_EQ(session.publicKey(), first_key);
    session.join(kMachine);
  });
  auto [from, join] = coordinator.acceptProbeAndJoin();
  EXPECT_EQ(join.name, "node_8");
  EXPECT_EQ(from.user_id, first_key);
  coordinator.reply(from, encode(Rejected{"node_8 was replaced"}));
  try {
    again.join();
    FAIL() << "not refused";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("remove that file to join as a new volunteer"),
              std::string::npos)
        << e.what();
  }
}

TEST(VolunteerSession, StoppingWhileWaitingSaysLeavingAndFinishedEndsTheWait) {
  FakeCoordinator coordinator;
  TempDir dir;
  std::atomic<bool> abandon{false};
  std::atomic<bool> first_done{false};
  AssignmentWait first, second;
  VolunteerThread volunteer(abandon, [&] {
    VolunteerSession session(configFor(coordinator, dir.path + "/v", &abandon));
    ASSERT_TRUE(session.join(kMachine).has_value());
    first = session.waitForAssignment();  // ends with `finished`
    first_done = true;
    second = session.waitForAssignment();  // ends with the stop
  });
  auto [from, join] = coordinator.acceptProbeAndJoin();
  coordinator.reply(from, encode(Accepted{"node_2", "spare", "", ""}));
  auto [beat_from, beat] = coordinator.expect<Heartbeat>();
  coordinator.reply(beat_from, encode(Finished{"the run is complete"}));
  ASSERT_TRUE(eventually([&] { return first_done.load(); }));
  abandon = true;  // the stop (a signal in provider)
  auto [leaving_from, leaving] = coordinator.expect<LeavingNotice>();
  EXPECT_EQ(leaving.name, "node_2");
  EXPECT_EQ(leaving.reason, "stopped");
  volunteer.join();
  EXPECT_EQ(first.end, AssignmentWait::End::kFinished);
  EXPECT_EQ(first.reason, "the run is complete");
  EXPECT_EQ(second.end, AssignmentWait::End::kStopped);
}

TEST(VolunteerSession, ResultsNotAcknowledgedAreResentThenReportedAsNotDelivered) {
  FakeCoordinator coordinator;
  TempDir dir;
  std::atomic<bool> abandon{false};
  const std::string weights = dir.path + "/w.pt";
  {
    std::ofstream(weights, std::ios::binary) << "w";
  }
  bool uploaded = true;
  VolunteerThread volunteer(abandon, [&] {
    VolunteerConfig config = configFor(coordinator, dir.path + "/v", &abandon);
    config.result_resend = 50ms;
    config.result_wait = 1500ms;  // the coordinator never acknowledges
    VolunteerSession session(config);
    ASSERT_TRUE(session.join(kMachine).has_value());
    uploaded = session.uploadResult({{"steps", 1}}, weights);
  });
  auto [from, join] = coordinator.acceptProbeAndJoin();
  coordinator.reply(from, encode(Accepted{"node_1", "spare", "", ""}));
  coordinator.expect<ResultUpload>();
  coordinator.expect<ResultUpload>();  // resent: no ack came
  volunteer.join();
  EXPECT_FALSE(uploaded);
}

TEST(VolunteerWorkdir, TheSameStageAgainKeepsItsCheckpointsAnotherOneMovesTheFolderAside) {
  TempDir dir;
  VolunteerWorkdir workdir(dir.path + "/w");
  const CurveKeyPair identity = workdir.loadOrCreateIdentity();
  CheckedAssignment a = checkAssignment(goodAssignment("node_4", "127.0.0.1:7001"), "node_4",
                                        identity.public_key, "c");
  const WrittenAssignment first = workdir.writeAssignment(a, identity);
  EXPECT_FALSE(first.resume);
  const std::string checkpoints = nodeDirectory(first.node_data, "node_4") + "/checkpoints";
  // Given again without checkpoints: nothing to resume from, a fresh folder.
  EXPECT_FALSE(workdir.writeAssignment(a, identity).resume);
  EXPECT_TRUE(fs::exists(workdir.path() + "/node_data.previous/nodes/node_4/node.json"));
  // A valid checkpoint of the stage: the same assignment again resumes from it, in place.
  CheckpointData data;
  data.step = 5;
  data.tensors = {{"stage.w", torch::ones({3})}};
  writeCheckpoint(checkpoints, data, 3);
  const WrittenAssignment again = workdir.writeAssignment(a, identity);
  EXPECT_TRUE(again.resume);
  EXPECT_EQ(again.checkpoint_steps, std::vector<int64_t>{5});
  EXPECT_EQ(validCheckpointSteps(checkpoints), std::vector<int64_t>{5});
  // Another stage of the job: the old folder (checkpoint included) moves aside.
  CheckedAssignment other = a;
  other.node.cluster = 1;
  const WrittenAssignment moved = workdir.writeAssignment(other, identity);
  EXPECT_FALSE(moved.resume);
  EXPECT_TRUE(validCheckpointSteps(checkpoints).empty());
  EXPECT_EQ(validCheckpointSteps(workdir.path() + "/node_data.previous/nodes/node_4/checkpoints"),
            std::vector<int64_t>{5});
  EXPECT_EQ(readNodeSpec(nodeSpecPath(moved.node_data, "node_4")).cluster, 1);
}

TEST(VolunteerWorkdir, AMalformedMembershipFileIsBadInputNamingItsKey) {
  TempDir dir;
  VolunteerWorkdir workdir(dir.path + "/w");
  EXPECT_FALSE(workdir.readMembership().has_value());
  const Membership m{"10.0.0.1:7000", generateCurveKeyPair().public_key, "node_3"};
  workdir.writeMembership(m);
  const auto back = workdir.readMembership();
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->coordinator, m.coordinator);
  EXPECT_EQ(back->coordinator_key, m.coordinator_key);
  EXPECT_EQ(back->name, m.name);
  writeJsonFile(workdir.membershipPath(),
                {{"format", 1}, {"coordinator", "c:1"}, {"coordinator_key", "short"}, {"name", "n"}});
  try {
    workdir.readMembership();
    FAIL() << "a bad key was read";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(workdir.membershipPath()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("coordinator_key"), std::string::npos) << e.what();
  }
}

// Training must never wait for the coordinator: with nobody listening the heartbeats are not sent
// (counted), stop() returns at once, and a coordinator that comes up gets them from then on.
TEST(VolunteerHeartbeats, NeverWaitForACoordinatorThatIsDownAndReachOneThatComesUp) {
  const CurveKeyPair volunteer = generateCurveKeyPair();
  zmq::context_t context;
  Invite invite;
  const auto port = FakeCoordinator().bound;  // a kernel port, free again once that one is gone
  invite.host = "127.0.0.1";
  invite.port = std::stoi(port.substr(port.rfind(':') + 1));
  invite.token = "00112233445566778899aabbccddeeff";
  CurveKeyPair coordinator_keys = generateCurveKeyPair();
  invite.coordinator_key = coordinator_keys.public_key;
  VolunteerHeartbeats heartbeats(context, volunteer, invite, "node_6", "training", 10ms);
  ASSERT_TRUE(eventually([&] { return heartbeats.unsent() >= 3; })) << heartbeats.sent() << " sent, " << heartbeats.unsent() << " unsent";
  EXPECT_EQ(heartbeats.sent(), 0u);
  // The coordinator comes up at that address.
  zmq::context_t coordinator_context;
  ZapAuthenticator zap(coordinator_context, ZapAuthenticator::AnyKey{});
  std::string bound;
  zmq::socket_t router = coordinationServer(coordinator_context, coordinator_keys,
                                            invite.address(), kLimit, &bound);
  auto in = recvRouted(router, 10s);
  ASSERT_TRUE(in.has_value());
  EXPECT_EQ(in->user_id, volunteer.public_key);
  std::string why;
  auto beat = decodeToCoordinator(in->frames, kLimit, &why);
  ASSERT_TRUE(beat && std::holds_alternative<Heartbeat>(*beat)) << why;
  EXPECT_EQ(std::get<Heartbeat>(*beat).name, "node_6");
  EXPECT_EQ(std::get<Heartbeat>(*beat).state, "training");
  EXPECT_TRUE(eventually([&] { return heartbeats.sent() >= 1; }));  // counted after the send
  const auto before = std::chrono::steady_clock::now();
  heartbeats.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - before, 5s);
}

// The relay volunteers' parts (Coordination.h: join's relay, heartbeat's relay, relay_links):
// round trips field for field, and each malformed form refused naming its key.
TEST(Coordination, RelayOffersFiguresAndLinksRoundTripAndBadOnesAreRefused) {
  JoinAsk join{"a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4", "10.0.0.7:7300",
               {15.5, 8, 123.25, 940.5, {}, "1.13.0"}, "", 200.5};
  EXPECT_EQ(roundTripToCoordinator<JoinAsk>(encode(join)).relay_mbps, std::optional<double>(200.5));
  join.relay_mbps = 0;  // no cap
  EXPECT_EQ(roundTripToCoordinator<JoinAsk>(encode(join)).relay_mbps, std::optional<double>(0));
  join.relay_mbps.reset();  // a training volunteer: no key at all
  EXPECT_EQ(nlohmann::json::parse(encode(join)[0]).count("relay"), 0u);
  EXPECT_FALSE(roundTripToCoordinator<JoinAsk>(encode(join)).relay_mbps.has_value());

  const Heartbeat beat = roundTripToCoordinator<Heartbeat>(
      encode(Heartbeat{"node_5", "relaying", -1, RelayFigures{12, 3456789, 1024, 7}}));
  ASSERT_TRUE(beat.relay.has_value());
  EXPECT_EQ(beat.relay->messages, 12);
  EXPECT_EQ(beat.relay->bytes, 3456789);
  EXPECT_EQ(beat.relay->waiting, 1024);
  EXPECT_EQ(beat.relay->refused, 7);
  EXPECT_FALSE(roundTripToCoordinator<Heartbeat>(encode(Heartbeat{"n", "training", 3})).relay.has_value());

  const std::string ka(40, 'a'), kb(40, 'b'), kc(40, 'c');
  const RelayLinksUpdate links{"node_5", {{"node_1", ka}, {"node_2", kb}, {"node_3", kc}},
                               {{"node_1", "node_2"}, {"node_2", "node_3"}}};
  const RelayLinksUpdate l = roundTripToVolunteer<RelayLinksUpdate>(encode(links));
  EXPECT_EQ(l.name, "node_5");
  EXPECT_EQ(l.members, links.members);
  EXPECT_EQ(l.links, links.links);
  EXPECT_TRUE(roundTripToVolunteer<RelayLinksUpdate>(encode(RelayLinksUpdate{"node_5", {}, {}})).links.empty());

  auto refusedToCoordinator = [](nlohmann::json h) {
    h["protocol"] = kCoordinationProtocol;
    std::string why;
    EXPECT_FALSE(decodeToCoordinator(Frames{h.dump()}, 1024, &why).has_value()) << h.dump();
    return why;
  };
  nlohmann::json bad_join = nlohmann::json::parse(encode(join)[0]);
  for (const nlohmann::json& offer : {nlohmann::json{{"mbps", -1}}, nlohmann::json{{"mbps", 2e6}},
                                      nlohmann::json{{"mbps", "fast"}}, nlohmann::json(7)}) {
    bad_join["relay"] = offer;
    EXPECT_NE(refusedToCoordinator(bad_join).find("\"relay\""), std::string::npos) << offer.dump();
  }
  nlohmann::json bad_beat = nlohmann::json::parse(encode(beat)[0]);
  bad_beat["relay"]["bytes"] = -5;
  EXPECT_NE(refusedToCoordinator(bad_beat).find("\"relay\""), std::string::npos);

  auto refusedToVolunteer = [](const nlohmann::json& h) {
    std::string why;
    EXPECT_FALSE(decodeToVolunteer(Frames{h.dump()}, 1024, &why).has_value()) << h.dump();
    return why;
  };
  const nlohmann::json good = nlohmann::json::parse(encode(links)[0]);
  nlohmann::json bad = good;
  bad["members"]["node_1"] = "not a key";
  EXPECT_NE(refusedToVolunteer(bad).find("\"members\""), std::string::npos);
  bad = good;
  bad["links"].push_back({"node_1", "node_9"});  // not a member
  EXPECT_NE(refusedToVolunteer(bad).find("\"links\""), std::string::npos);
  bad = good;
  bad["links"].push_back({"node_1", "node_1"});  // a link to itself
  EXPECT_NE(refusedToVolunteer(bad).find("\"links\""), std::string::npos);
  bad = good;
  bad["links"] = {{"node_1"}};
  EXPECT_NE(refusedToVolunteer(bad).find("\"links\""), std::string::npos);
  bad = good;
  bad.erase("members");
  EXPECT_NE(refusedToVolunteer(bad).find("\"members\""), std::string::npos);
}

}  // namespace
}  // namespace cairn
