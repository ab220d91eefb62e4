// MailboxStageLink: the trainer's StageLink over this node's Mailbox (and so its one transport).
// It knows the node's upstream and downstream peers from node.json, turns StagePackets into wire
// Messages (activations, gradients, evaluation batches, control) and back, and enforces the
// timeouts: a neighbour that does not answer within the peer timeout ends the run with PeerLost
// naming it and what was awaited.
//
// connect() is the start-up handshake: it says hello to every neighbour (retrying while the
// neighbour's socket is not up yet) and waits for each neighbour's hello, so nodes may start in any
// order. A neighbour that never appears within the startup timeout is a PeerLost naming it. Each
// hello names itself (this link's random run and its handshake count) and the newest hello taken
// from the receiver (docs/PROTOCOL.md `hello`): so a neighbour that restarted is told apart from a
// repeat, and one whose hello does not answer this node's hears it again (takeHello).
//
// Lost neighbours (docs/OPERATIONS.md "Failures while training"): while waiting, a neighbour is
// declared lost — PeerLost naming it, and lost() says how — when its connection has been down
// (Transport::liveness kDisconnected) for `timeouts.lost` (training_definition.timeouts.
// peer_timeout_s; `timeouts.lost_sharing_rings` when shorter and this node shares a ring with
// other clusters), when it sent "leaving" (clean shutdown or a pause spreading along the pipeline),
// or when it says "hello" mid-run (it restarted). The long `timeouts.peer` stays the fallback for a
// neighbour that is connected but silent.
// Every received pipeline message is checked against what this node expects before the trainer
// sees it (LinkChecks; the checks are node/pipeline/StageLinkValidation.h): activations and
// evaluation batches only from the upstream neighbour, gradients only from the downstream one,
// this job's id, a step within the window, the planned boundary (tensor count, names, dtypes,
// shapes with the first dimension at most the micro-batch or evaluation batch size), a byte
// limit, and finite values. A message that fails is dropped,
// counted by reason (stats()) and logged; with nonfinite "stop" a NaN/Inf ends the run with
// BadInput naming the peer. Messages of other kinds from other peers (collectives) are left in the
// mailbox for their owners.
// Ownership: borrows the mailbox. Thread-safety: the transport's owning thread only.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/Error.h"
#include "core/NodeData.h"
#include "node/pipeline/StageLinkValidation.h"
#include "node/protocol/PipelineControl.h"
#include "node/transport/Mailbox.h"
#include "trainer/Device.h"
#include "trainer/StageLink.h"

#include <nlohmann/json.hpp>

namespace cairn {

struct LinkTimeouts {
  std::chrono::milliseconds startup{60000};
  std::chrono::milliseconds peer{120000};
  // A neighbour whose connection is down this long is lost (timeouts.peer_timeout_s).
  std::chrono::milliseconds lost{10000};
  // The same for a node that shares a ring with other clusters (node.json lists a ring of more
  // than one member), when shorter than `lost`: the other clusters' ring members wait at their
  // next sync for this node, which waits for the neighbour, so every cluster would stall for
  // `lost` after a kill. The rings themselves drop a member whose connection is down this long
  // (ProcessGroupOptions::disconnected_grace); a neighbour so long gone has left its own rings.
  std::chrono::milliseconds lost_sharing_rings{1000};
  // A neighbour still connected after `peer` without the awaited message (its ZMTP heartbeats
  // answer: it runs, e.g. in a cross-cluster sync its ring holds while a member is replaced) is
  // waited for up to this long in all (timeouts.max_wait_s); not more than `peer` when smaller.
  std::chrono::milliseconds connected{0};
};

// Interrupted (core/Error.h) is thrown by connect() when `interrupted` (a stop flag set by a
// signal handler) became true while it waited for a neighbour; by send() and receive() mid-run
// when it has been true for timeouts.lost while they still wait (a stop asked while a neighbour
// sends nothing: the clean stop at a step boundary cannot come, so the node gives up the step and
// leaves; its newest checkpoint keeps its work).

// PeerLoss::reason of a neighbour lost because its node was given to another volunteer
// (setReplaced), cause kDisconnected.
inline constexpr const char* kReplacedReason = "replaced";

// Why received messages were dropped, by reason ("unknown_peer", "kind_not_allowed", "job_id",
// "step_window", "tensor_count", "tensor_name", "dtype", "shape", "bytes", "encoding",
// "nonfinite").
struct LinkStats {
  uint64_t accepted = 0;
  std::map<std::string, uint64_t> dropped;
  uint64_t droppedTotal() const;
};

class MailboxStageLink : public StageLink {
 public:
  MailboxStageLink(Mailbox& mailbox, const NodeSpec& node, LinkTimeouts timeouts,
                   LinkChecks checks = {});
  // Adds the neighbours to the transport and runs the hello handshake, waiting at most `timeout`
  // (default: timeouts.startup) for the neighbours. Called again after a pause: a fresh handshake.
  // `timeout_key` names the setting `timeout` comes from, for the error message.
  void connect(std::optional<std::chrono::milliseconds> timeout = std::nullopt,
               const std::string& timeout_key = "training_definition.timeouts.startup_s");
  // Sends a "leaving" control message ({"reason": reason, "lost": lost}) to every neighbour except
  // `except`, waiting at most `timeout` each; failures are ignored (the neighbour may be gone).
  void announceLeaving(const std::string& reason, const std::string& lost = "",
                       const std::string& except = "",
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));
  // Drops buffered pipeline messages (tensor kinds and control, but not the recovery protocol's
  // hello/ckpt_steps/resume_at) from the neighbours: what is left of an abandoned run.
  size_t purgeStale();
  // The neighbour lost by the last PeerLost this link threw (cleared by connect()); the same
  // PeerLoss the exception carries (PeerLost::loss()), kept for diagnostics and tests.
  const std::optional<PeerLoss>& lost() const { return lost_; }
  const NodeSpec& node() const { return node_; }
  // True for the upstream or downstream neighbour's name.
  bool isNeighbour(const std::string& name) const;
  const LinkTimeouts& timeouts() const { return timeouts_; }
  // Asked while connect() waits (a stop flag): when true it throws Interrupted. Asked too, every
  // 0.5 s at most, while send() and receive() wait mid-run: true for timeouts.lost there (the stop
  // asked, and still no message) throws Interrupted.
  void setInterrupted(std::function<bool()> interrupted) { interrupted_ = std::move(interrupted); }
  // Asked every 0.5 s at most while send() and receive() wait on a neighbour (may be empty): true
  // means that neighbour's node was given to another volunteer (ProviderRunOptions::
  // neighbour_replaced): the wait ends at once with PeerLost (cause disconnected), as if its
  // connection had been down for timeouts.lost (a frozen or cut-off holder keeps it open).
  void setReplaced(std::function<bool(const std::string&)> replaced) { replaced_ = std::move(replaced); }
  // Where the stage trains (trainer/Device.h; null or the CPU: the host). A received compressed
  // boundary tensor (wire.activations bf16, fp16, int8) crosses there in its wire form and is
  // decoded there, so on a GPU a half or a quarter of the bytes cross PCIe and the host does not
  // widen it; the trainer gets it on the device. The same float32 values either way.
  void decodeOn(std::shared_ptr<const TensorPlacement> placement) {
    decode_on_ = std::move(placement);
  }
  void send(Neighbour to, const StagePacket& packet) override;
  StagePacket receive(Neighbour from, PacketKind kind, uint64_t step, uint64_t microbatch,
                      const std::string& tag) override;
  // Screens what has arrived as receive() does (bad messages and recoveries stay for it) and
  // takes the awaited packet if it is here, without waiting.
  std::optional<StagePacket> tryReceive(Neighbour from, PacketKind kind, uint64_t step,
                                        uint64_t microbatch, const std::string& tag) override;
  const LinkStats& stats() const { return stats_; }
  uint64_t bytesSent() const override { return mailbox_.transport().stats().bytes_sent; }
  // The byte limit in force: checks.max_message_bytes, or the planned boundary at the largest
  // batch plus 1 MiB for bookkeeping tensors.
  uint64_t maxMessageBytes() const { return max_message_bytes_; }

  // True for a neighbour's hello that this link has taken before (the same run and handshake):
  // sent again in answer to this node's hello in case the first went to this node's previous
  // process (connect()). It says nothing new and is dropped wherever it arrives.
  bool isRepeatedHello(const Message& m) const;

  // Why `m` may not be used (nullopt: it may): `awaited_step` is the step being worked on.
  // `deep` adds the per-tensor checks (boundary, bytes, finite values). Exposed for tests.
  std::optional<std::string> rejectReason(const Message& m, uint64_t awaited_step, bool deep,
                                          std::string* detail) const;

 private:
  const PeerRef& peer(Neighbour n) const;
  // What receive() does with `m` while it waits for (wire, step, microbatch, tag) from `p`.
  struct Screened {
    bool take = false;      // out of the mailbox: the awaited packet, or one of the two below
    bool recovery = false;  // a neighbour's "leaving" or "hello"
    bool repeat = false;    // a repeated hello (isRepeatedHello), taken to be dropped
    std::optional<std::string> rejected;  // why it is dropped (the quick checks)
    std::string detail;
  };
  Screened screen(const Message& m, const PeerRef& p, MessageKind wire, uint64_t step,
                  uint64_t microbatch, const std::string& tag) const;
  [[noreturn]] void throwLost(const PeerRef& p, Neighbour dir, PeerLoss lost, const std::string& what);
  // Throws PeerLost when `p` has been disconnected for lost_after_ (naming why when its "leaving"
  // is in the mailbox).
  void checkConnection(const PeerRef& p, Neighbour dir, const std::string& what);
  // Mid-run waits: throws Interrupted once `interrupted_` has said yes for timeouts.lost while
  // waiting for `what` from (or room at) `p`; `*stop_seen` keeps when it first said yes.
  void checkStopWhileWaiting(const PeerRef& p, const std::string& what,
                             std::optional<std::chrono::steady_clock::time_point>* stop_seen) const;
  void drop(const Message& m, const std::string& reason, const std::string& detail);
  // Before a later handshake: a neighbour whose hello is in the mailbox already restarted; this
  // node's connection to it may still end at its old process (its close not seen yet), where the
  // hello would be lost and the new process wait for it until its startup timeout. Such a
  // neighbour is dialled again first (Transport::redial). The first handshake has no connection
  // of before to fear: its transport's connections to the neighbours are new.
  // Returns the names of the neighbours dialled again.
  std::set<std::string> redialRestarted(const std::vector<std::pair<Neighbour, PeerRef>>& neighbours);
  // connect()'s wait for `p`'s hello (or, downstream, its "ckpt_steps") until `deadline`.
  std::optional<Message> awaitHello(Neighbour dir, const PeerRef& p,
                                    std::chrono::steady_clock::time_point deadline);
  // This handshake's hello to `p`, saying which of its hellos this link took last.
  Message hello(const std::string& peer) const;
  // Takes `p`'s hello `m` (its id is the newest heard from it). When `p` restarted (a run other
  // than the one heard before) after this node said hello, and its hello does not answer this
  // node's, this node's hello may have gone into the connection to its previous process, whose
  // close this node had not seen yet: lost, and the new process would wait for it until its
  // startup timeout. So `p` is dialled again and hears this node's hello once more (which it
  // drops as a repeat if it had the first one). Not for a neighbour `redialed` before this
  // handshake's hello: that one reached its new process.
  void takeHello(Neighbour dir, const PeerRef& p, const Message& m, const std::set<std::string>& redialed,
                 std::chrono::milliseconds left);
  // A neighbour's "leaving" or mid-run "hello" (`m`) while waiting for `what`: PeerLost naming it
  // (a hello goes back into the mailbox for the next connect()).
  [[noreturn]] void throwRecovery(Message m, const std::string& what);
  // An accepted message as the trainer's packet, compressed boundary tensors decoded to float32
  // (on decode_on_'s device).
  StagePacket unpack(Message m) const;

  Mailbox& mailbox_;
  NodeSpec node_;
  LinkTimeouts timeouts_;
  // How long a neighbour's connection may be down before it is lost: timeouts_.lost, or
  // timeouts_.lost_sharing_rings when shorter and node_ shares a ring with other clusters.
  std::chrono::milliseconds lost_after_;
  LinkChecks checks_;
  uint64_t max_message_bytes_ = 0;
  LinkStats stats_;
  std::optional<PeerLoss> lost_;
  int64_t handshakes_ = 0;  // connect() calls that completed
  HelloId hello_id_;        // this link's run, and connect() calls begun
  std::map<std::string, HelloId> heard_;  // the newest hello taken from each neighbour
  std::function<bool()> interrupted_;
  std::function<bool(const std::string&)> replaced_;
  std::shared_ptr<const TensorPlacement> decode_on_;
};

}  // namespace cairn
