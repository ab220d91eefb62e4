// The coordinator's side of checkpoint uploads (coordinator/CheckpointUploads.h), driven as its
// loop drives it, with a real store, Outbox and CheckpointWriter: every answer goes back on the
// connection (routing id) the upload came on, never by the member's key. A volunteer's heartbeat,
// metrics and upload sockets share its key, and the coordinator's route for a key is that of its
// last message: the ack of a file written off the loop used to go to whichever socket had spoken
// meanwhile (integration.volunteers.checkpoint_upload failed so: the volunteer's upload socket
// waited 30 s for an ack its heartbeat socket had dropped, and uploaded nothing newer).
#include <gtest/gtest.h>

#include <poll.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/CheckpointUploads.h"
#include "coordinator/CoordinatorStore.h"
#include "coordinator/Outbox.h"
#include "core/CurveKeys.h"
#include "core/Fnv.h"
#include "tests/coordinator/MemberRows.h"
#include "tests/common/ScratchDir.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;

struct Sent {
  std::string routing_id;
  ToVolunteer message;
};

struct UploadsFixture {
  std::string dir;
  CoordinatorStore store;
  std::vector<Sent> sent;
  Outbox outbox;
  CheckpointUploads uploads;
  explicit UploadsFixture(const std::string& name)
      : dir(fresh(name)),
        store(dir + "/coordinator.db"),
        outbox(store, [this](const std::string& routing_id, const Frames& frames) {
          std::string why;
          auto m = decodeToVolunteer(frames, 1 << 20, &why);
          ASSERT_TRUE(m.has_value()) << why;
          sent.push_back({routing_id, std::move(*m)});
        }),
        uploads(store, outbox, dir, [] { return int64_t(100); },
                [this](const std::string& routing_id, const Frames& frames) {
                  outbox.send(routing_id, frames);
                }) {
    store.putMember(test_rows::memberRow("node_0", generateCurveKeyPair().public_key,
                                         "127.0.0.1:7000", MemberState::kAssigned));
  }
  static std::string fresh(const std::string& name) {
    return ::cairn::testing::scratchDir("uploads_" + name);
  }
  // As the loop does once the writer's fd is readable (waiting for it at most 10 s), until the
  // written files have been given `answers` answers in all.
  void takeWritten(size_t answers) {
    for (size_t taken = 0; taken < answers;) {
      pollfd p{uploads.readyFd(), POLLIN, 0};
      ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the writer wrote nothing within 10 s";
      const size_t before = sent.size();
      uploads.takeWritten();
      taken += sent.size() - before;
    }
  }
};

CheckpointUpload uploadOf(int64_t step, const std::string& bytes) {
  return CheckpointUpload{"node_0", step, fnv1a64(bytes), bytes};
}

// The ack of a written file goes to the upload's connection; messages from the member's other
// connections (the loop handled them meanwhile) change nothing here. A repeat of the held one is
// answered at once on its own connection, a corrupt upload refused on its.
TEST(CheckpointUploads, EachAnswerGoesBackOnTheConnectionTheUploadCameOn) {
  UploadsFixture f("route");
  f.uploads.onUpload(uploadOf(10, "ten"), "uploads-socket");
  f.takeWritten(1);
  ASSERT_EQ(f.sent.size(), 1u);
  EXPECT_EQ(f.sent[0].routing_id, "uploads-socket");
  ASSERT_TRUE(std::holds_alternative<CheckpointAck>(f.sent[0].message));
  EXPECT_EQ(std::get<CheckpointAck>(f.sent[0].message).step, 10);
  f.uploads.onUpload(uploadOf(10, "ten"), "after-reconnect");  // held already: answered at once
  ASSERT_EQ(f.sent.size(), 2u);
  EXPECT_EQ(f.sent[1].routing_id, "after-reconnect");
  EXPECT_EQ(std::get<CheckpointAck>(f.sent[1].message).step, 10);
  CheckpointUpload corrupt = uploadOf(20, "twenty");
  corrupt.file = "twentY";
  f.uploads.onUpload(std::move(corrupt), "uploads-socket-2");
  f.takeWritten(1);
  ASSERT_EQ(f.sent.size(), 3u);
  EXPECT_EQ(f.sent[2].routing_id, "uploads-socket-2");
  EXPECT_TRUE(std::holds_alternative<Rejected>(f.sent[2].message));
  ASSERT_TRUE(f.store.checkpoint("node_0").has_value());
  EXPECT_EQ(f.store.checkpoint("node_0")->step, 10);
}

// A resend of the file being written (the volunteer's connection closed and it sent it again on a
// new one) is answered once, after the write, on the resend's connection: the first may be gone.
// Two files written in a row are each answered on their own connection, in order.
TEST(CheckpointUploads, AResendWhileWritingIsAnsweredOnceOnTheResendsConnection) {
  UploadsFixture f("resend");
  f.uploads.onUpload(uploadOf(10, "ten"), "closed-connection");
  f.uploads.onUpload(uploadOf(10, "ten"), "new-connection");  // takeWritten not run in between
  f.uploads.onUpload(uploadOf(20, "twenty"), "newer-connection");
  f.takeWritten(2);
  ASSERT_EQ(f.sent.size(), 2u);
  EXPECT_EQ(f.sent[0].routing_id, "new-connection");
  EXPECT_EQ(std::get<CheckpointAck>(f.sent[0].message).step, 10);
  EXPECT_EQ(f.sent[1].routing_id, "newer-connection");
  EXPECT_EQ(std::get<CheckpointAck>(f.sent[1].message).step, 20);
  EXPECT_EQ(f.store.checkpoint("node_0")->step, 20);
}

}  // namespace
}  // namespace cairn::coordinator
