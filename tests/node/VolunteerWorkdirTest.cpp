// A volunteer's work folder (node/volunteer/VolunteerWorkdir.h): the same stage again keeps its
// checkpoints, another moves the folder aside, a malformed membership file is refused; and its
// heartbeats never wait for a coordinator that is down (PlayedCoordinator.h).
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
#include "node/protocol/Coordination.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/NodeSecurity.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/ReachabilityResponder.h"
#include "node/volunteer/VolunteerAssignment.h"
#include "node/volunteer/VolunteerHeartbeats.h"
#include "node/volunteer/VolunteerSession.h"
#include "node/volunteer/VolunteerWorkdir.h"
#include "tests/node/PlayedCoordinator.h"
#include "trainer/Checkpoint.h"

// The played coordinator and its helpers (PlayedCoordinator.h) are cairn::testing's: so are these.
namespace cairn::testing {
namespace {


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
  const auto port = PlayedCoordinator().bound;  // a kernel port, free again once that one is gone
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

// A fresh heartbeat socket's first beat cannot go out before its handshake (ZMQ_IMMEDIATE): it is
// tried again within 100 ms, not an interval later (here a minute, which the wait below never
// reaches): a volunteer that starts to train has just closed its waiting socket, and the
// coordinator counts a member whose connections all closed as gone after --gone-after-s (3 s).
TEST(VolunteerHeartbeats, TheFirstBeatOnANewSocketIsRetriedUntilTakenNotAnIntervalLater) {
  const CurveKeyPair volunteer = generateCurveKeyPair();
  const CurveKeyPair coordinator_keys = generateCurveKeyPair();
  zmq::context_t coordinator_context;
  ZapAuthenticator zap(coordinator_context, ZapAuthenticator::AnyKey{});
  std::string bound;
  zmq::socket_t router = coordinationServer(coordinator_context, coordinator_keys, "127.0.0.1:0", kLimit, &bound);
  Invite invite;
  invite.host = "127.0.0.1";
  invite.port = std::stoi(bound.substr(bound.rfind(':') + 1));
  invite.token = "00112233445566778899aabbccddeeff";
  invite.coordinator_key = coordinator_keys.public_key;
  zmq::context_t context;
  VolunteerHeartbeats heartbeats(context, volunteer, invite, "node_6", "training", 60s);
  const auto in = recvRouted(router, 30s);
  ASSERT_TRUE(in.has_value()) << heartbeats.sent() << " sent, " << heartbeats.unsent() << " unsent";
  std::string why;
  const auto beat = decodeToCoordinator(in->frames, kLimit, &why);
  ASSERT_TRUE(beat && std::holds_alternative<Heartbeat>(*beat)) << why;
  EXPECT_TRUE(eventually([&] { return heartbeats.sent() == 1; }));
  heartbeats.stop();
}

}  // namespace
}  // namespace cairn::testing
