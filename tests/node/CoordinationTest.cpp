// The coordination protocol (node/protocol/Coordination.h): every message round-trips field for
// field, each malformed case is refused with its reason, invites round-trip and bad ones are
// BadInput, and the relay volunteers' parts do the same. The volunteer's side of the protocol:
// VolunteerSessionTest.cpp and VolunteerWorkdirTest.cpp.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <sstream>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/GpuFigures.h"
#include "core/JsonReader.h"
#include "node/protocol/Coordination.h"
#include "trainer/Checkpoint.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

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
