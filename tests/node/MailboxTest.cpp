#include <gtest/gtest.h>

#include "node/Mailbox.h"
#include "node/ZmqTransport.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

Message tagged(MessageKind kind, const std::string& tag) {
  Message m;
  m.kind = kind;
  m.tag = tag;
  m.sender = "a";
  return m;
}

TEST(Mailbox, SelectiveReceiveKeepsOthersInArrivalOrder) {
  zmq::context_t context;
  ZmqTransport a(context, "a", "inproc://mb_a"), b(context, "b", "inproc://mb_b");
  a.addPeer("b", "inproc://mb_b");
  for (const char* tag : {"x1", "y1", "x2", "y2"})
    ASSERT_EQ(a.send("b", tagged(tag[0] == 'x' ? MessageKind::kActivation : MessageKind::kGradient, tag), 1s),
              SendStatus::kSent);
  Mailbox box(b);
  auto isGradient = [](const Message& m) { return m.kind == MessageKind::kGradient; };
  auto isActivation = [](const Message& m) { return m.kind == MessageKind::kActivation; };
  auto g1 = box.receive(isGradient, 2s);
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->tag, "y1");
  EXPECT_EQ(box.buffered(), 1u);  // x1 was read past and kept
  auto g2 = box.receive(isGradient, 2s);
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->tag, "y2");
  auto x1 = box.receive(isActivation, 2s);
  auto x2 = box.receive(isActivation, 2s);
  ASSERT_TRUE(x1 && x2);
  EXPECT_EQ(x1->tag, "x1");
  EXPECT_EQ(x2->tag, "x2");
  EXPECT_FALSE(box.receive(isActivation, 50ms));
}

TEST(Mailbox, BoundedBufferDropsOldestUnwanted) {
  zmq::context_t context;
  ZmqTransport a(context, "a", "inproc://mbb_a"), b(context, "b", "inproc://mbb_b");
  a.addPeer("b", "inproc://mbb_b");
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(a.send("b", tagged(MessageKind::kControl, "junk" + std::to_string(i)), 1s), SendStatus::kSent);
  ASSERT_EQ(a.send("b", tagged(MessageKind::kGradient, "wanted"), 1s), SendStatus::kSent);
  Mailbox box(b, /*max_buffered=*/3);
  auto got = box.receive([](const Message& m) { return m.kind == MessageKind::kGradient; }, 2s);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->tag, "wanted");
  EXPECT_EQ(box.buffered(), 3u);
  EXPECT_EQ(box.droppedForSpace(), 2u);
  auto oldest = box.receive([](const Message&) { return true; }, 50ms);
  ASSERT_TRUE(oldest);
  EXPECT_EQ(oldest->tag, "junk2");
}

}  // namespace
}  // namespace cairn
