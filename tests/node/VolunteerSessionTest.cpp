// The volunteer's side of the coordination protocol: the reachability responder answers only the
// coordinator's key (real CurveZMQ sockets on 127.0.0.1); VolunteerSession is driven through
// join → rejected, join → accepted → a malformed assignment, a good assignment written to disk,
// heartbeats and the result upload by a fake coordinator played by the test (PlayedCoordinator.h),
// with no training.
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


TEST(VolunteerSession, ARejectedJoinIsBadInputWithTheCoordinatorsReason) {
  PlayedCoordinator coordinator;
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
  PlayedCoordinator coordinator;
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

TEST(VolunteerSession, AMalformedAssignmentIsBadInputNamingTheCoordinator) {
  PlayedCoordinator coordinator;
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
  PlayedCoordinator coordinator;
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
  PlayedCoordinator coordinator;
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
  PlayedCoordinator coordinator;
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
  PlayedCoordinator coordinator;
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

}  // namespace
}  // namespace cairn::testing
