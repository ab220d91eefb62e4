// VolunteerCheckpoints against a fake coordinator (a CurveZMQ ROUTER admitting any key): the
// trainer's own checkpoint writer fills a folder; the fake coordinator must receive exactly the
// newest valid checkpoint, byte-identical to the file on disk, with its FNV-1a checksum; at most
// one is in flight (nothing more before the `checkpoint_ack`); the rate limit holds (with a rate
// so low that the next send is due in an hour, a new checkpoint is not sent; with a high rate it
// is); a corrupt newest file is skipped for the newest valid one; a coordinator that is down gets
// nothing queued and, once up, exactly the newest; one killed before its acknowledgement gets the
// newest again once it is back.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "core/Error.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/volunteer/VolunteerCheckpoints.h"
#include "node/protocol/Coordination.h"
#include "tests/common/Eventually.h"
#include "tests/common/FakeCoordinator.h"
#include "tests/common/LoopbackPorts.h"
#include "trainer/Checkpoint.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
constexpr size_t kVolunteerCheckpointsLimit = 64 << 20;

// The fake coordinator (tests/common/FakeCoordinator.h) reading checkpoint uploads.
struct Coordinator : testing::FakeCoordinator {
  explicit Coordinator(int port = 0, CurveKeyPair k = generateCurveKeyPair())
      : FakeCoordinator(kVolunteerCheckpointsLimit, port, std::move(k)) {}
  // The next checkpoint upload within `wait`, or nullopt.
  std::optional<std::pair<Routed, CheckpointUpload>> upload(std::chrono::milliseconds wait) {
    return next<CheckpointUpload>(wait, "a checkpoint");
  }
  void ack(const Routed& to, const std::string& name, int64_t step) {
    answer(to, CheckpointAck{name, step});
  }
};

struct VolunteerCheckpointsTempDir {
  std::string path;
  VolunteerCheckpointsTempDir() {
    path = (fs::temp_directory_path() / ("cairn_ckpt_upload_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(std::random_device{}())))
               .string();
    fs::create_directories(path);
  }
  ~VolunteerCheckpointsTempDir() { fs::remove_all(path); }
};

// A checkpoint of `step` written by the trainer's writer (keeps up to 10).
void writeStep(const std::string& dir, int64_t step) {
  CheckpointData d;
  d.step = step;
  torch::manual_seed(uint64_t(step));
  d.tensors.push_back({"stage.weight", torch::randn({64, 32})});
  d.tensors.push_back({"stage.bias", torch::randn({32})});
  d.meta["job_id"] = "test";
  writeCheckpoint(dir, d, 10);
}

std::string fileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

CheckpointUploadOptions fast(double mbps) {
  CheckpointUploadOptions o;
  o.upload_mbps = mbps;
  o.poll = 20ms;
  return o;
}

TEST(VolunteerCheckpoints, SendsOnlyTheNewestByteForByteAndOneAtATime) {
  VolunteerCheckpointsTempDir dir;
  writeStep(dir.path, 10);
  writeStep(dir.path, 20);
  Coordinator coordinator;
  zmq::context_t context;
  VolunteerCheckpoints uploads(context, generateCurveKeyPair(), coordinator.invite(), "node_2",
                               dir.path, fast(1e6));
  auto first = coordinator.upload(10s);
  ASSERT_TRUE(first.has_value()) << "no checkpoint within 10 s";
  const std::string on_disk = fileBytes(checkpointPath(dir.path, 20));
  EXPECT_EQ(first->second.name, "node_2");
  EXPECT_EQ(first->second.step, 20);
  EXPECT_EQ(first->second.file, on_disk);
  EXPECT_EQ(first->second.checksum, fnv1a64(on_disk));

  // Not acknowledged yet: a newer checkpoint waits (one in flight at most).
  writeStep(dir.path, 30);
  EXPECT_FALSE(coordinator.upload(500ms).has_value());
  EXPECT_EQ(uploads.sent(), 1u);
  coordinator.ack(first->first, "node_2", 20);
  auto second = coordinator.upload(10s);
  ASSERT_TRUE(second.has_value()) << "the checkpoint of step 30 was not sent after the ack";
  EXPECT_EQ(second->second.step, 30);
  EXPECT_EQ(second->second.file, fileBytes(checkpointPath(dir.path, 30)));
  coordinator.ack(second->first, "node_2", 30);
  ASSERT_TRUE(::cairn::testing::eventually([&] { return uploads.acknowledgedStep() == 30; }));
  // Acknowledged and nothing newer: nothing more (step 10 is never sent).
  EXPECT_FALSE(coordinator.upload(300ms).has_value());
  EXPECT_EQ(uploads.sent(), 2u);
  EXPECT_EQ(uploads.bytesSent(), on_disk.size() + second->second.file.size());
}

TEST(VolunteerCheckpoints, TheRateLimitHoldsTheNextUploadBack) {
  VolunteerCheckpointsTempDir dir;
  writeStep(dir.path, 10);
  const double bytes = double(fs::file_size(checkpointPath(dir.path, 10)));
  Coordinator coordinator;
  zmq::context_t context;
  // After this file, the next send is due in one hour.
  VolunteerCheckpoints uploads(context, generateCurveKeyPair(), coordinator.invite(), "node_1",
                               dir.path, fast(bytes * 8 / (3600 * 1e6)));
  auto first = coordinator.upload(10s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->second.step, 10);
  coordinator.ack(first->first, "node_1", 10);
  ASSERT_TRUE(::cairn::testing::eventually([&] { return uploads.acknowledgedStep() == 10; }));
  writeStep(dir.path, 20);
  EXPECT_FALSE(coordinator.upload(1s).has_value()) << "sent before B*8/rate seconds";
  EXPECT_EQ(uploads.sent(), 1u);
  uploads.stop();
}

TEST(VolunteerCheckpoints, ACorruptNewestIsSkippedAndFinishSendsTheLast) {
  VolunteerCheckpointsTempDir dir;
  writeStep(dir.path, 10);
  writeStep(dir.path, 20);
  {  // flip a byte near the end (tensor data) of step 20: its checksum no longer matches
    std::fstream f(checkpointPath(dir.path, 20), std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  Coordinator coordinator;
  zmq::context_t context;
  VolunteerCheckpoints uploads(context, generateCurveKeyPair(), coordinator.invite(), "node_3",
                               dir.path, fast(1e6));
  auto first = coordinator.upload(10s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->second.step, 10);
  EXPECT_EQ(first->second.file, fileBytes(checkpointPath(dir.path, 10)));
  coordinator.ack(first->first, "node_3", 10);
  ASSERT_TRUE(::cairn::testing::eventually([&] { return uploads.acknowledgedStep() == 10; }));

  // finish(): the checkpoint written last goes up and is acknowledged before it returns.
  writeStep(dir.path, 40);
  std::thread finisher([&] { uploads.finish(10s); });
  auto last = coordinator.upload(10s);
  if (last) coordinator.ack(last->first, "node_3", 40);
  finisher.join();
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->second.step, 40);
  EXPECT_EQ(uploads.acknowledgedStep(), 40);
  EXPECT_EQ(uploads.sent(), 2u);
}

TEST(VolunteerCheckpoints, ACoordinatorThatIsDownIsSkippedAndGetsTheNewestWhenItComes) {
  VolunteerCheckpointsTempDir dir;
  writeStep(dir.path, 10);
  const int port = testutil::freeLoopbackPorts(1)[0];
  const CurveKeyPair coordinator_keys = generateCurveKeyPair();
  Invite invite;
  invite.host = "127.0.0.1";
  invite.port = port;
  invite.coordinator_key = coordinator_keys.public_key;
  invite.token = "00112233445566778899aabbccddeeff";
  zmq::context_t context;
  VolunteerCheckpoints uploads(context, generateCurveKeyPair(), invite, "node_5", dir.path, fast(1e6));
  // Nobody listens: nothing is queued (a send is refused at once), however many polls go by.
  std::this_thread::sleep_for(300ms);  // ~15 polls of 20 ms; not a synchronisation: sent() must stay 0
  EXPECT_EQ(uploads.sent(), 0u);
  writeStep(dir.path, 20);
  writeStep(dir.path, 30);
  Coordinator coordinator(port, coordinator_keys);  // the coordinator comes up
  auto first = coordinator.upload(20s);
  ASSERT_TRUE(first.has_value()) << "nothing after the coordinator came up";
  EXPECT_EQ(first->second.step, 30);
  EXPECT_EQ(first->second.file, fileBytes(checkpointPath(dir.path, 30)));
  coordinator.ack(first->first, "node_5", 30);
  ASSERT_TRUE(::cairn::testing::eventually([&] { return uploads.acknowledgedStep() == 30; }));
  EXPECT_FALSE(coordinator.upload(300ms).has_value()) << "an older checkpoint was sent too";
  EXPECT_EQ(uploads.sent(), 1u);
}

TEST(VolunteerCheckpoints, ACoordinatorKilledBeforeItsAckGetsTheNewestAgainOnceItIsBack) {
  // A coordinator killed mid-upload (then restarted on its port) never acknowledges what it got:
  // the closed connection says so, and the newest is offered again at once, not after an
  // ack_timeout of ten minutes (the relay_restart integration test's volunteers once waited
  // out their finish() for such an acknowledgement).
  VolunteerCheckpointsTempDir dir;
  writeStep(dir.path, 10);
  const int port = testutil::freeLoopbackPorts(1)[0];
  const CurveKeyPair coordinator_keys = generateCurveKeyPair();
  auto coordinator = std::make_unique<Coordinator>(port, coordinator_keys);
  zmq::context_t context;
  CheckpointUploadOptions options = fast(1e6);
  options.ack_timeout = std::chrono::minutes(10);
  VolunteerCheckpoints uploads(context, generateCurveKeyPair(), coordinator->invite(), "node_4",
                               dir.path, options);
  auto first = coordinator->upload(10s);
  ASSERT_TRUE(first.has_value()) << "no checkpoint within 10 s";
  EXPECT_EQ(first->second.step, 10);
  writeStep(dir.path, 20);
  coordinator.reset();  // killed before its ack
  Coordinator again(port, coordinator_keys);
  auto second = again.upload(20s);
  ASSERT_TRUE(second.has_value()) << "the unacknowledged upload was not offered again";
  EXPECT_EQ(second->second.step, 20);
  EXPECT_EQ(second->second.file, fileBytes(checkpointPath(dir.path, 20)));
  again.ack(second->first, "node_4", 20);
  ASSERT_TRUE(::cairn::testing::eventually([&] { return uploads.acknowledgedStep() == 20; }));
  EXPECT_EQ(uploads.sent(), 2u);
}

}  // namespace
}  // namespace cairn
