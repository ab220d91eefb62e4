// A live coordinator on loopback (LiveCoordinatorHarness.h) over real CurveZMQ sockets: it admits
// a reachable volunteer and refuses each bad join, admits relays that answer, checks IPv6
// addresses, admits while a plan is being made, keeps its invite across a restart and the last
// checkpoint per node, tells then blocks a flooding key, bounds the routes of non-members, and
// stores the GPUs a volunteer reports.
#include <gtest/gtest.h>

#include <future>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "clusterize/NodeDataWriter.h"
#include "coordinator/Coordinator.h"
#include "coordinator/CoordinatorStore.h"
#include "tests/coordinator/MemberRows.h"
#include "coordinator/JoinPolicy.h"
#include "coordinator/RunAssembly.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/GpuFigures.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"
#include "core/TorchCompat.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/Relay.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/coordinator/LiveCoordinatorHarness.h"

// The harness (LiveCoordinatorHarness.h) is cairn::coordinator::testing's: so are these tests.
namespace cairn::coordinator::testing {
namespace {

namespace fs = std::filesystem;

TEST(LiveCoordinator, AdmitsAReachableVolunteerAndRefusesEachBadJoin) {
  const std::string out = freshDir("live");
  LiveCoordinator coordinator(out);
  zmq::context_t ctx;

  // The good join: token right, address answers the dial-back with the volunteer's own key.
  Client good(ctx, coordinator.invite());
  FakeResponder responder(good.keys, coordinator.invite().coordinator_key);
  const auto accepted = good.ask(encode(goodAsk(responder.address())));
  ASSERT_TRUE(accepted.has_value());
  ASSERT_TRUE(std::holds_alternative<Accepted>(*accepted));
  EXPECT_EQ(std::get<Accepted>(*accepted).name, "node_0");
  EXPECT_EQ(std::get<Accepted>(*accepted).state, "spare");

  Client bad(ctx, coordinator.invite());
  JoinAsk wrong_token = goodAsk("127.0.0.1:7100");
  wrong_token.token = std::string(32, 'a');
  EXPECT_EQ(bad.refusal(encode(wrong_token)), "wrong invite token");
  // Another volunteer cannot take an address a member advertises.
  EXPECT_NE(bad.refusal(encode(goodAsk(responder.address()))).find("already taken by node_0"),
            std::string::npos);
  // An address nobody answers at (a kernel port just released): not refused, but admitted as
  // dial-out only after the dial-back, and told so in one line (docs/OPERATIONS.md "Behind a
  // home router").
  const int dead_port = testutil::freeLoopbackPorts(1)[0];
  const std::string dead = "127.0.0.1:" + std::to_string(dead_port);
  auto reachability = [&](const JoinAsk& ask) {
    Client volunteer(ctx, coordinator.invite());
    const auto answer = volunteer.ask(encode(ask));
    return answer && std::holds_alternative<Accepted>(*answer)
               ? std::get<Accepted>(*answer).reachability
               : std::string("(not accepted)");
  };
  const std::string unreachable = reachability(goodAsk(dead));
  EXPECT_NE(unreachable.find("dial-out only: the advertised address " + dead + " did not answer"),
            std::string::npos) << unreachable;
  EXPECT_NE(unreachable.find("forward TCP ports " + std::to_string(dead_port)), std::string::npos);
  EXPECT_NE(unreachable.find("came from 127.0.0.1") == std::string::npos &&
                unreachable.find("come from 127.0.0.1") == std::string::npos,
            true) << unreachable;
  // An address that answers, but with another volunteer's key: the CURVE handshake fails, so
  // the dial-back gets no answer — the key in the join and the address must belong together.
  EXPECT_NE(reachability(goodAsk(FakeResponder(generateCurveKeyPair(),
                                               coordinator.invite().coordinator_key)
                                     .address()))
                .find("dial-out only"),
            std::string::npos);
  // An address that answers on its port but not on the next one: dial-out only, told which.
  {
    Client half(ctx, coordinator.invite());
    FakeResponder port_only(half.keys, coordinator.invite().coordinator_key, /*accept_too=*/false);
    const auto answer = half.ask(encode(goodAsk(port_only.address())));
    ASSERT_TRUE(answer && std::holds_alternative<Accepted>(*answer));
    const std::string next = std::to_string(std::stoi(port_only.address().substr(10)) + 1);
    EXPECT_NE(std::get<Accepted>(*answer).reachability.find(
                  "answered but 127.0.0.1:" + next + " (where volunteers behind routers connect) did not"),
              std::string::npos)
        << std::get<Accepted>(*answer).reachability;
  }
  // No address at all (provider --join without --listen): dial-out only at once.
  EXPECT_NE(reachability(goodAsk("")).find("dial-out only: no address given"), std::string::npos);
  // Malformed and oversized messages.
  EXPECT_NE(bad.refusal({"{not json"}).find("header is not a JSON object"), std::string::npos);
  EXPECT_NE(bad.refusal({R"({"type":"join","protocol":99})"}).find("\"protocol\" must be 1"),
            std::string::npos);
  EXPECT_NE(bad.refusal({R"({"type":"join","protocol":1,"token":5})"}).find("\"token\" must be a string"),
            std::string::npos);
  BandwidthProbeMsg big{std::string((1 << 20) + 10, 'x')};
  EXPECT_NE(bad.refusal(encode(big)).find("exceeds the limit"), std::string::npos);
  // Speaking for a member it is not.
  EXPECT_NE(bad.refusal(encode(Heartbeat{"node_0", "training", 5})).find("you are not node_0"),
            std::string::npos);
  // The member itself may heartbeat (no answer expected, and no refusal).
  EXPECT_FALSE(good.ask(encode(Heartbeat{"node_0", "waiting", -1}), milliseconds(300)).has_value());

  // A client holding the wrong coordinator key never gets through: no answer, nothing counted.
  Client stranger(ctx, coordinator.invite(), generateCurveKeyPair().public_key);
  EXPECT_FALSE(stranger.ask(encode(goodAsk("127.0.0.1:7200")), milliseconds(1000)).has_value());

  const CoordinatorStats& stats = coordinator.stop();
  EXPECT_EQ(stats.refused_joins, 2u);  // token, taken
  EXPECT_EQ(stats.malformed, 5u);      // not JSON, protocol, token type, big, not node_0
  // 1 good join + 1 heartbeat + 2 refused joins + 4 dial-out-only joins + 5 malformed; the
  // stranger's never arrived.
  EXPECT_EQ(stats.messages, 13u);
  CoordinatorStore store(out + "/coordinator.db");
  ASSERT_EQ(store.members().size(), 5u);
  EXPECT_EQ(store.members()[0].public_key, good.keys.public_key);
  for (const Member& m : store.members()) {  // the dial-out-only ones have no address
    EXPECT_EQ(m.dial_out_only, m.name != "node_0") << m.name;
    EXPECT_EQ(m.advertise.empty(), m.dial_out_only) << m.name;
  }
}

// The first plan is made on a thread of its own: held there before it starts, the loop still
// admits the next volunteer (made on the loop, as before, this join got no answer). The plan of
// this test's empty model then fails and the coordinator waits for one volunteer more.
// A relay's join: the coordinator attaches to a real relay (node/transport/Relay.h) at the
// advertised address with its own key; answered, the relay is admitted as `relaying` and hears
// its links (none yet) at its first heartbeat; an address where no relay answers is refused, and
// the refusal says what to forward.
TEST(LiveCoordinator, AdmitsARelayThatAnswersAndRefusesOneThatDoesNot) {
  const std::string out = freshDir("relay");
  LiveCoordinator coordinator(out);  // the production reach timeout: a good relay never misses it
  zmq::context_t ctx;
  Client volunteer(ctx, coordinator.invite());
  RelayOptions o;
  o.bind_endpoint = "tcp://127.0.0.1:*";
  o.own = volunteer.keys;
  Relay relay(o);
  relay.setLinks({{kRelayCoordinatorMember, coordinator.invite().coordinator_key}}, {});
  const std::string bound = relay.boundEndpoint();
  JoinAsk ask = goodAsk(bound.substr(bound.find("://") + 3));
  ask.relay_mbps = 80;
  const auto accepted = volunteer.ask(encode(ask));
  ASSERT_TRUE(accepted && std::holds_alternative<Accepted>(*accepted));
  EXPECT_EQ(std::get<Accepted>(*accepted).state, "relaying");
  EXPECT_EQ(relay.stats().attaches, 1u);  // the coordinator's check, under its own key
  const std::string name = std::get<Accepted>(*accepted).name;
  const auto links = volunteer.ask(encode(Heartbeat{name, "relaying", -1, RelayFigures{}}));
  ASSERT_TRUE(links && std::holds_alternative<RelayLinksUpdate>(*links));
  EXPECT_EQ(std::get<RelayLinksUpdate>(*links).name, name);
  EXPECT_TRUE(std::get<RelayLinksUpdate>(*links).links.empty());

  Client silent(ctx, coordinator.invite());
  const std::string dead = "127.0.0.1:" + std::to_string(testutil::freeLoopbackPorts(1)[0]);
  JoinAsk nobody = goodAsk(dead);
  nobody.relay_mbps = 0;
  const std::string why = silent.refusal(encode(nobody));
  EXPECT_NE(why.find("the relay at " + dead + " did not answer the coordinator"), std::string::npos) << why;
  EXPECT_NE(why.find("forward TCP port"), std::string::npos) << why;
  coordinator.stop();
  CoordinatorStore store(out + "/coordinator.db");
  ASSERT_TRUE(store.memberByName(name).has_value());
  EXPECT_EQ(store.memberByName(name)->state, MemberState::kRelaying);
  EXPECT_EQ(store.members().size(), 1u);  // the silent one is not a member
}

// Reachability is checked for IPv6 as for IPv4: a volunteer advertising [::1]:PORT whose address
// answers there (on its port and the next) is admitted reachable at that address; one advertising
// an unbracketed IPv6 address is refused naming the brackets.
TEST(LiveCoordinator, ChecksAnIpv6AddressAsAnIpv4One) {
  const std::string out = freshDir("ipv6");
  LiveCoordinator coordinator(out);
  zmq::context_t ctx;
  Client volunteer(ctx, coordinator.invite());
  std::unique_ptr<FakeResponder> responder;
  try {
    responder = std::make_unique<FakeResponder>(volunteer.keys, coordinator.invite().coordinator_key,
                                                true, "[::1]");
  } catch (const BadInput& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  ASSERT_EQ(responder->address().rfind("[::1]:", 0), 0u) << responder->address();
  const auto accepted = volunteer.ask(encode(goodAsk(responder->address())));
  ASSERT_TRUE(accepted && std::holds_alternative<Accepted>(*accepted));
  EXPECT_EQ(std::get<Accepted>(*accepted).reachability, "");  // reachable: no dial-out-only line
  Client unbracketed(ctx, coordinator.invite());
  EXPECT_NE(unbracketed.refusal(encode(goodAsk("::1:7100"))).find("IPv6 address in brackets"),
            std::string::npos);
  coordinator.stop();
  CoordinatorStore store(out + "/coordinator.db");
  const auto m = store.memberByKey(volunteer.keys.public_key);
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->dial_out_only);
  EXPECT_EQ(m->advertise, responder->address());
}

TEST(LiveCoordinator, AdmitsVolunteersWhileThePlanIsBeingMade) {
  const std::string out = freshDir("plan_off_loop");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> plans{0};
  LiveCoordinator coordinator(out, milliseconds(5000), {}, [&](CoordinatorOptions& o) {
    o.min_volunteers = 1;
    o.before_plan = [&plans, released] {
      ++plans;
      released.wait();
    };
  });
  zmq::context_t ctx;
  JoinedMember first(ctx, coordinator);
  for (int i = 0; i < 500 && plans.load() == 0; ++i) std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(plans.load(), 1) << "no plan started with one spare waiting";
  JoinedMember second(ctx, coordinator);  // throws when not accepted within the ask's 10 s
  EXPECT_EQ(second.name, "node_1");
  const auto ack = second.client.ask(encode(BandwidthProbeMsg{std::string(64, 'x')}));
  ASSERT_TRUE(ack.has_value());
  EXPECT_TRUE(std::holds_alternative<BandwidthAck>(*ack));
  EXPECT_EQ(plans.load(), 1);
  release.set_value();
  coordinator.stop();
  CoordinatorStore store(out + "/coordinator.db");
  EXPECT_EQ(store.meta("phase").value_or("gathering"), "gathering");
  EXPECT_EQ(store.members().size(), 2u);
}

TEST(LiveCoordinator, KeepsItsInviteAcrossARestart) {
  const std::string out = freshDir("restart");
  std::string first;
  {
    CoordinatorOptions o;
    o.listen = "127.0.0.1:0";
    o.out = out;
    Coordinator c(o, clusterize::PreparedModel{});
    first = c.invite();
  }
  CoordinatorOptions o;
  o.listen = "127.0.0.1:0";
  o.out = out;
  Coordinator again(o, clusterize::PreparedModel{});
  const Invite a = parseInvite(first), b = parseInvite(again.invite());
  EXPECT_EQ(a.coordinator_key, b.coordinator_key);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(fs::status(out + "/coordinator.key").permissions() &
                (fs::perms::group_all | fs::perms::others_all),
            fs::perms::none);
}

// Checkpoint uploads: each is answered with `checkpoint_ack` naming the step held; one per node is
// kept on disk (the previous file removed) and in coordinator.db: the last one sent, unless it
// repeats the held one (same step and bytes: nothing changes). A node sends an older step, or the
// same step with other bytes, only after its cluster resumed from an earlier checkpoint (issue [Q]:
// the abandoned run's step kept here was given to a spare whose neighbours train another run).
TEST(LiveCoordinator, KeepsTheLastCheckpointPerNodeAndAcknowledgesIt) {
  const std::string out = freshDir("checkpoints");
  LiveCoordinator coordinator(out);
  zmq::context_t ctx;
  JoinedMember joined(ctx, coordinator);
  Client& member = joined.client;
  const std::string name = joined.name;
  auto upload = [&](int64_t step, const std::string& bytes) -> int64_t {
    const auto reply = member.ask(encode(CheckpointUpload{name, step, fnv1a64(bytes), bytes}));
    if (!reply || !std::holds_alternative<CheckpointAck>(*reply)) return -1;
    EXPECT_EQ(std::get<CheckpointAck>(*reply).name, name);
    // No plan yet, so no placed node holds one: keep every checkpoint (keep_from 0).
    EXPECT_EQ(std::get<CheckpointAck>(*reply).keep_from, 0);
    return std::get<CheckpointAck>(*reply).step;
  };
  auto held = [&] {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(out + "/checkpoints/" + name))
      files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    return files;
  };
  auto contents = [&](const std::string& file) {
    std::ifstream in(out + "/checkpoints/" + name + "/" + file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(upload(10, "ten"), 10);
  EXPECT_EQ(held(), std::vector<std::string>{"step_10.ckpt"});
  EXPECT_EQ(contents("step_10.ckpt"), "ten");
  EXPECT_EQ(upload(20, "twenty"), 20);
  EXPECT_EQ(held(), std::vector<std::string>{"step_20.ckpt"});
  EXPECT_EQ(contents("step_20.ckpt"), "twenty");
  EXPECT_EQ(upload(20, "twenty"), 20);  // a resend: nothing changes
  EXPECT_EQ(contents("step_20.ckpt"), "twenty");
  EXPECT_EQ(upload(15, "fifteen"), 15);  // resumed from step 15: the abandoned step 20 goes
  EXPECT_EQ(held(), std::vector<std::string>{"step_15.ckpt"});
  EXPECT_EQ(contents("step_15.ckpt"), "fifteen");
  EXPECT_EQ(upload(20, "other"), 20);  // step 20 of the resumed run
  EXPECT_EQ(upload(20, "other"), 20);
  EXPECT_EQ(held(), std::vector<std::string>{"step_20.ckpt"});
  EXPECT_EQ(contents("step_20.ckpt"), "other");
  // An upload whose bytes do not match its checksum (checked by the writer, off the loop): refused
  // with the decoder's reason, nothing written, the step-20 file and row kept.
  const auto corrupt = member.ask(encode(CheckpointUpload{name, 30, fnv1a64("thirty"), "thirtY"}));
  ASSERT_TRUE(corrupt.has_value());
  ASSERT_TRUE(std::holds_alternative<Rejected>(*corrupt));
  EXPECT_EQ(std::get<Rejected>(*corrupt).reason,
            "malformed message: checkpoint: the attachment does not match its checksum");
  EXPECT_EQ(held(), std::vector<std::string>{"step_20.ckpt"});
  coordinator.stop();
  CoordinatorStore store(out + "/coordinator.db");
  const auto row = store.checkpoint(name);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->step, 20);
  EXPECT_EQ(row->path, out + "/checkpoints/" + name + "/step_20.ckpt");
  EXPECT_EQ(row->checksum, fnv1a64("other"));
}

// A key flooding a live coordinator (issue [Q]): its budget is taken (each answered: it is no
// member), the first drop is answered once naming the limits, the drop_after-th blocks it (answered
// once), and from then on nothing of it is answered, while a member's request is answered all along.
// Refill is made negligible (one message per 1000 s), so the counts follow from the limits alone.
TEST(LiveCoordinator, AFloodingKeyIsToldThenBlockedWhileAMemberIsStillAnswered) {
  const std::string out = freshDir("flood");
  FloodLimits flood;
  flood.messages_per_s = 0.001;
  flood.message_burst = 20;
  flood.drop_after = 200;
  flood.block_s = 3600;
  LiveCoordinator coordinator(out, milliseconds(5000), flood);
  zmq::context_t ctx;
  JoinedMember joined(ctx, coordinator);
  Client& member = joined.client;

  Client flooder(ctx, coordinator.invite());
  constexpr int kSent = 1000;
  for (int i = 0; i < kSent; ++i) sendFrames(flooder.socket, encode(Heartbeat{"node_0", "training", i}));
  std::vector<std::string> answers;
  while (answers.empty() || answers.back().find("blocked for") == std::string::npos) {
    const auto reply = recvFrames(flooder.socket, milliseconds(20000));
    ASSERT_TRUE(reply) << "no answer after " << answers.size() << " answers";
    std::string why;
    const auto m = decodeToVolunteer(*reply, 1 << 20, &why);
    ASSERT_TRUE(m && std::holds_alternative<Rejected>(*m)) << why;
    answers.push_back(std::get<Rejected>(*m).reason);
  }
  ASSERT_EQ(answers.size(), 22u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(answers[i], "you are not node_0: join first") << i;
  EXPECT_NE(answers[20].find("too many messages: this key may send at most 0.001 messages (20 at once)"),
            std::string::npos) << answers[20];
  EXPECT_NE(answers[21].find("blocked for 3600 s after 200 messages dropped in one flood"), std::string::npos)
      << answers[21];
  // The member is answered; the blocked key is not, whatever it asks.
  const auto ack = member.ask(encode(BandwidthProbeMsg{std::string(1000, 'x')}));
  ASSERT_TRUE(ack && std::holds_alternative<BandwidthAck>(*ack));
  sendFrames(flooder.socket, encode(BandwidthProbeMsg{std::string(1000, 'x')}));
  EXPECT_FALSE(recvFrames(flooder.socket, milliseconds(1000))) << "a blocked key was answered";
  const CoordinatorStats& stats = coordinator.stop();
  EXPECT_EQ(stats.flood_dropped, uint64_t(kSent - 20 + 1));  // the probe too
  EXPECT_EQ(stats.flood_blocked, 1u);
}

// The coordinator keeps a route back to every key that wrote it (for replies sent later). Keys
// are free to make, so past FloodLimits::max_keys routes those of non-members are forgotten: 12
// fresh keys writing once each leave at most max_keys (3) routes beside the member's, and the
// member is still answered.
TEST(LiveCoordinator, RoutesOfKeysThatAreNotMembersAreBounded) {
  const std::string out = freshDir("routes");
  FloodLimits flood;
  flood.max_keys = 3;
  LiveCoordinator coordinator(out, milliseconds(5000), flood);
  zmq::context_t ctx;
  JoinedMember joined(ctx, coordinator);
  Client& member = joined.client;
  const std::string name = joined.name;
  for (int i = 0; i < 12; ++i) {
    Client stranger(ctx, coordinator.invite());
    EXPECT_EQ(stranger.refusal(encode(Heartbeat{name, "training", i})),
              "you are not " + name + ": join first");
  }
  const auto ack = member.ask(encode(CheckpointUpload{name, 5, fnv1a64("five"), "five"}));
  ASSERT_TRUE(ack && std::holds_alternative<CheckpointAck>(*ack)) << "the member's route was lost";
  const CoordinatorStats& stats = coordinator.stop();
  EXPECT_GE(stats.routes, 1u);
  EXPECT_LE(stats.routes, 1u + flood.max_keys);
}

// GPUs and libtorch versions at a live coordinator: a volunteer's GPUs and libtorch are stored
// with it; one whose libtorch is older than the one that writes the stage files (no plan yet: the
// coordinator's own) and one claiming an impossible GPU each receive the sentence saying so.
TEST(LiveCoordinator, StoresTheGpusAndRefusesAnOlderLibtorchAndAnImpossibleGpuSayingWhy) {
  const std::string out = freshDir("gpus");
  LiveCoordinator coordinator(out);
  zmq::context_t ctx;
  Client good(ctx, coordinator.invite());
  FakeResponder responder(good.keys, coordinator.invite().coordinator_key);
  JoinAsk ask = goodAsk(responder.address());
  ask.probe.gpus = {{"NVIDIA H100 80GB HBM3", 79.1, 51.0, 600.0, 25.0, 24.0}};
  ask.probe.libtorch = libtorchVersion();
  const auto accepted = good.ask(encode(ask));
  ASSERT_TRUE(accepted && std::holds_alternative<Accepted>(*accepted));

  Client old(ctx, coordinator.invite());
  JoinAsk old_ask = goodAsk("127.0.0.1:7300");
  old_ask.probe.libtorch = "1.0.0";
  const std::string writer = libtorchVersion();
  EXPECT_EQ(old.refusal(encode(old_ask)),
            "this volunteer's libtorch 1.0.0 cannot load stage files written by libtorch " + writer +
                "; install cairn built against libtorch ≥ " + std::to_string(TORCH_VERSION_MAJOR) +
                "." + std::to_string(TORCH_VERSION_MINOR));
  JoinAsk impossible = goodAsk("127.0.0.1:7301");
  impossible.probe.gpus = {{"NVIDIA H100 80GB HBM3", 79.1, 51.0, 5000.0, 25.0, 24.0}};
  const std::string why = old.refusal(encode(impossible));
  EXPECT_EQ(why.rfind("malformed message: join: probe: gpus[0]: bf16_tflops must be at most 2000 TFLOP/s", 0),
            0u)
      << why;

  coordinator.stop();
  CoordinatorStore store(out + "/coordinator.db");
  ASSERT_EQ(store.members().size(), 1u);
  const nlohmann::json probe = nlohmann::json::parse(store.members()[0].probe_json);
  EXPECT_EQ(probe["libtorch"], libtorchVersion());
  EXPECT_EQ(parseGpuFigures(probe["gpus"], "probe_json")[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(probe["ram_gb"], 8.0);  // the figures the planner reads stay where they were
  // ... and the planner sees the GPU, as node_configs.json's benchmarks.gpus would give it.
  const std::vector<NodeConfig> configs = volunteerConfigs(store.members());
  ASSERT_EQ(configs.size(), 1u);
  ASSERT_EQ(configs[0].gpus.size(), 1u);
  EXPECT_EQ(configs[0].gpus[0].bf16_tflops, 600.0);
  EXPECT_EQ(configs[0].ram_gb, 8.0);
}

}  // namespace
}  // namespace cairn::coordinator::testing
