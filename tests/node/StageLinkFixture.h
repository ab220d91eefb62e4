// Test fixture of the stage-link tests (StageLinkValidationTest, StageLinkDeviceTest): the node
// "stem" of a 3-stage pipeline (planned input x [8, 4], output y [8, 2]) with its MailboxStageLink
// over a real ZmqTransport on inproc, its two neighbours and a stranger as transports of their
// own, and the genuine messages the tests forge variants of.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "node/pipeline/MailboxStageLink.h"
#include "node/transport/ZmqTransport.h"

namespace cairn::testing {

using namespace std::chrono_literals;

inline NodeSpec stemSpec() {
  NodeSpec n;
  n.name = "stem";
  n.job_id = "job";
  n.address = "127.0.0.1:1";
  n.stage = 1;
  n.num_stages = 3;
  n.role = StageRole::kStem;
  n.upstream = PeerRef{"up", "127.0.0.1:2", ""};
  n.downstream = PeerRef{"down", "127.0.0.1:3", ""};
  n.inputs = {BoundaryValue{"x", "tensor", "float32", {8, 4}}};
  n.outputs = {BoundaryValue{"y", "tensor", "float32", {8, 2}}};
  return n;
}

inline Message genuineActivation(uint64_t step = 0, uint64_t microbatch = 0) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.job_id = "job";
  m.sender = "up";
  m.step = step;
  m.microbatch = microbatch;
  m.tensors.push_back({"x", torch::full({8, 4}, 0.5)});
  m.tensors.push_back({"__targets", torch::zeros({8}, torch::kLong)});
  return m;
}

inline Message genuineGradient() {
  Message m;
  m.kind = MessageKind::kGradient;
  m.job_id = "job";
  m.sender = "down";
  m.tensors.push_back({"y", torch::full({8, 2}, 0.25)});
  m.tensors.push_back({"__loss", torch::tensor(1.0, torch::kDouble)});
  return m;
}

// Three neighbours of "stem" (and a stranger) as real transports on inproc.
struct Fixture {
  zmq::context_t context;
  std::string prefix;
  ZmqTransport stem, up, down, stranger;
  Mailbox mailbox;
  MailboxStageLink link;

  explicit Fixture(const std::string& p, LinkChecks checks)
      : prefix(p),
        stem(context, "stem", "inproc://" + p + "stem"),
        up(context, "up", "inproc://" + p + "up"),
        down(context, "down", "inproc://" + p + "down"),
        stranger(context, "stranger", "inproc://" + p + "stranger"),
        mailbox(stem),
        link(mailbox, stemSpec(), LinkTimeouts{10s, 500ms}, checks) {
    for (ZmqTransport* t : {&up, &down, &stranger}) t->addPeer("stem", "inproc://" + p + "stem");
  }
  void send(ZmqTransport& from, const Message& m) {
    ASSERT_EQ(from.send("stem", m, 5s), SendStatus::kSent);
  }
};

inline LinkChecks defaultChecks() {
  LinkChecks c;
  c.max_microbatch_rows = 8;
  c.max_eval_rows = 16;
  c.step_window = 4;
  return c;
}

// Sends an activation packet (the planned output "y" and two bookkeeping tensors) through the
// stem's link to "down" and returns the message as it travelled (no tensors if none arrived).
inline Message sentDownstream(Fixture& f, const torch::Tensor& y) {
  f.stem.addPeer("down", "inproc://" + f.prefix + "down");
  StagePacket out;
  out.kind = PacketKind::kActivation;
  out.tensors = {{"y", y}, {"__loss", torch::tensor(1.25f)}, {"__targets", torch::arange(8)}};
  f.link.send(Neighbour::kDownstream, out);
  std::optional<Message> sent = f.down.receive(5s);
  if (!sent) ADD_FAILURE() << "nothing arrived downstream";
  return sent ? std::move(*sent) : Message{};
}

}  // namespace cairn::testing
