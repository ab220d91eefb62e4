// MailboxStageLink: the trainer's StageLink over this node's Mailbox (and so its one transport).
// It knows the node's upstream and downstream peers from node.json, turns StagePackets into wire
// Messages (activations, gradients, evaluation batches, control) and back, and enforces the
// timeouts: a neighbour that does not answer within the peer timeout ends the run with PeerLost
// naming it and what was awaited.
//
// connect() is the start-up handshake: it says hello to every neighbour (retrying while the
// neighbour's socket is not up yet) and waits for each neighbour's hello, so nodes may start in any
// order. A neighbour that never appears within the startup timeout is a PeerLost naming it.
// Ownership: borrows the mailbox. Thread-safety: the transport's owning thread only.
#pragma once

#include <chrono>
#include <string>

#include "core/NodeData.h"
#include "node/Mailbox.h"
#include "trainer/StageLink.h"

namespace cairn {

struct LinkTimeouts {
  std::chrono::milliseconds startup{60000};
  std::chrono::milliseconds peer{120000};
};

class MailboxStageLink : public StageLink {
 public:
  MailboxStageLink(Mailbox& mailbox, const NodeSpec& node, LinkTimeouts timeouts);
  // Adds the neighbours to the transport and runs the hello handshake.
  void connect();
  void send(Neighbour to, const StagePacket& packet) override;
  StagePacket receive(Neighbour from, PacketKind kind, uint64_t step, uint64_t microbatch,
                      const std::string& tag) override;

 private:
  const PeerRef& peer(Neighbour n) const;

  Mailbox& mailbox_;
  NodeSpec node_;
  LinkTimeouts timeouts_;
};

}  // namespace cairn
