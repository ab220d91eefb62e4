// CollectiveChannel: the chunks of one collective group, sent and received with failure
// detection. What every collective algorithm (ProcessGroup) stands on: numbered operations, a
// validated chunk from a given member, a chunk to a given member, and the notices that make a
// lost member fail everyone promptly (abort, keep-alive, leave).
//
// Messages: kind kCollective, tag "coll:<group id>", step = this group's operation sequence
// number, microbatch = the index of the message within the operation; the abort, keep-alive and
// leave notices are defined in node/protocol/CollectiveNotices.h. A received chunk is
// validated (member sender, expected index, one tensor, dtype, element count) before use; a bad
// one is dropped and counted, never trusted. Messages of other groups, of later operations and
// of other kinds stay in the mailbox for whoever asks for them. Chunks that arrive before they
// are asked for (gather and barrier hear from several members in any order) are kept aside.
//
// Failure: every wait (for a chunk, or for room to send one) is bounded by `timeout`; past it the
// operation throws PeerLost naming the peer that did not answer, and tells the other members
// (an abort message) so that they fail promptly naming the same peer instead of waiting in turn.
// A member that has waited a quarter of the timeout tells the others it is alive and whom it
// waits for (a keep-alive), so that its neighbours blame the lost member, not it; no wait lasts
// more than twice the timeout. After a failure the channel is broken: every later operation
// throws the same PeerLost, and lostPeer() names the member blamed. Every PeerLost carries the
// PeerLoss (core/Error.h): kSilent (timeout), kDisconnected (transport), kAborted (another
// member's abort), kLeft (a leave).
// Fail fast: when the transport reports the awaited member kDisconnected (Transport::liveness) for
// `disconnected_grace`, or the caller says it was replaced (ProcessGroupOptions::replaced: its
// node was given to another process, which will never send this group's chunks), the wait ends
// at once as if the timeout had passed (same abort).
// Leave: sendLeave() tells every other member that this node is going away. A member that has it
// throws PeerLost naming the leaver (lostByLeave() true) as soon as it waits for a message the
// leaver did not send before leaving, or would send to it — never after a timeout — and forwards
// the leave to the others (who then fail at once); a leave from a member that already sent all
// this operation needs from it does not fail the operation.
//
// Zero copy: a chunk is handed to the transport as a view of the caller's tensor; finish() returns
// only once the transport has let go of every view, so the caller may overwrite its tensor then.
//
// Ownership: borrows the Mailbox (and through it the transport), which must outlive the channel
// and must already know every other member as a peer (Transport::addPeer). Owned by its
// ProcessGroup. Thread-safety: one thread at a time (the group's); channels of different groups
// may share one Mailbox from different threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/Error.h"
#include "node/transport/Mailbox.h"
#include "node/collectives/ReduceMath.h"

namespace cairn {

struct ProcessGroupOptions {
  // Longest wait for any one expected message (or for room to send one) before PeerLost.
  std::chrono::milliseconds timeout{30000};
  // Size of one pipelined segment on the wire. Large enough that per-message costs vanish, small
  // enough that several segments are in flight on every link. Chunk sizes follow from it: every
  // member of a group must use the same value.
  size_t segment_bytes = 1 << 20;
  // Messages a node may have sent ahead of what it has received in a ring. Must stay below the
  // transport's per-peer queue (TransportOptions send + receive high-water marks, 16 + 16 by
  // default) so that a full ring can never block with every node waiting to send.
  int max_in_flight = 8;
  // A member the transport has reported kDisconnected for this long is treated as lost at once
  // (capped at `timeout`), counted from the group's creation at the earliest: a member admitted
  // back into a ring (a new group) whose previous life's disconnection is still on record gets
  // the whole grace to connect. Transports that cannot tell (kUnknown) leave only the timeout.
  std::chrono::milliseconds disconnected_grace{1000};
  // How the chunks of a float32 sum/average allReduce travel (ReduceMath.h ChunkCodec;
  // training_definition.wire.sync): every member of a group must use the same value.
  ChunkCodec codec = ChunkCodec::kFp32;
  // Groups of at most this many members exchange directly instead of around the ring where the
  // ring costs latency (docs/COLLECTIVES.md "Direct exchanges"): allReduce when every block fits
  // one segment (2 message delays instead of 2(n−1)) and barrier (1 instead of ⌈log2 n⌉). 0 or 1:
  // always the ring / dissemination. Every member of a group must use the same value. The
  // environment variable CAIRN_DIRECT_MAX_MEMBERS, when set, overrides it (for A/B benchmarks).
  int direct_max_members = 16;
  // Whether the caller knows a member's process was replaced since this group was made (a spare
  // took its node over: node/ring/RingState.h ReplacedMembers); a wait on it then fails at once,
  // as kDisconnected. Null: never. Called on the group's thread every poll (100 ms) of a wait.
  std::function<bool(const std::string& member)> replaced;
  // This node was asked to stop (a signal; its node given to another volunteer). Null: never.
  // Asked on the group's thread every poll of a wait: once it has said yes for `interrupt_after`
  // while an operation still waits (a member silent for the whole `timeout`, its replacement's
  // welcome…), the operation throws Interrupted (core/Error.h), and so does every wait after it.
  // A stop asked at a sync that ends within the grace lets it end (the clean stop comes at the
  // step boundary that follows).
  std::function<bool()> interrupted;
  std::chrono::milliseconds interrupt_after{10000};
};

// The check behind ProcessGroupOptions::interrupted, for a group's waits and for the waits of
// what builds on groups with the same options (node/ring/RingState.h checkStop): throws
// Interrupted "<prefix>a stop was asked and, <interrupt_after> later, this node still waits
// (<waiting_for>); <then>" once `interrupted` has said yes for interrupt_after; `*seen` (one per
// wait or group, empty at first) keeps when it first said yes. Nothing while it is null.
void checkStopAsked(const ProcessGroupOptions& options,
                    std::optional<std::chrono::steady_clock::time_point>* seen,
                    const std::string& prefix, const std::string& waiting_for,
                    const std::string& then);

struct ProcessGroupStats {
  uint64_t operations = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;   // accepted chunks
  uint64_t bytes_sent = 0;          // tensor bytes
  uint64_t dropped_malformed = 0;   // wrong dtype / size / tensor count, non-member sender
  uint64_t dropped_unexpected = 0;  // duplicates, indices the operation never expects
  uint64_t dropped_stale = 0;       // of an operation this group finished, or of an earlier life
  double seconds_receiving = 0;     // blocked waiting for chunks (includes decoding them)
  double seconds_sending = 0;       // handing chunks to the transport (waiting for room)
  double seconds_completing = 0;    // waiting for the transport to let go of the last chunks
};

class CollectiveChannel {
 public:
  // The state of one collective call on this node.
  struct Operation {
    uint64_t sequence = 0;
    const char* name = "";
    // Messages of this operation that arrived before they were asked for, by (sender rank, index);
    // several per key are kept (a forged one must not shadow the real one), checked when asked for.
    std::multimap<std::pair<int, uint64_t>, Message> stash;
    // Views of the tensors handed to the transport, with their destination rank. Large ones are
    // sent without a copy: ZeroMQ holds a reference until the bytes have left (tcp) or the
    // receiver dropped them (inproc). The operation returns only once every one is released, so
    // the caller may reuse its tensor at once.
    std::vector<std::pair<int, torch::Tensor>> sent;
    std::string last_malformed;  // for the timeout message: what was wrong with a dropped chunk
    std::chrono::steady_clock::time_point began;  // for CAIRN_COLLECTIVE_TRACE
  };

  // `members` in rank order (unique names, `self` among them). Throws BadInput for an empty or too
  // long id, duplicate members, a `self` that is not a member, or options out of range.
  CollectiveChannel(Mailbox& mailbox, std::string group_id, std::vector<std::string> members,
                    const std::string& self, ProcessGroupOptions options);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::string& groupId() const { return group_id_; }
  const std::vector<std::string>& members() const { return members_; }
  const ProcessGroupOptions& options() const { return options_; }
  const ProcessGroupStats& stats() const { return stats_; }

  // A new operation (the next sequence number); throws the PeerLost of an earlier failure.
  Operation begin(const char* name);
  // Waits for the transport to release every chunk sent, then counts the operation.
  void finish(Operation& op);
  // Sends one chunk (a 1-d view of `data`) to `to_rank`, waiting for room at most the timeout.
  void sendChunk(Operation& op, int to_rank, uint64_t index, const torch::Tensor& data);
  // The chunk `index` of this operation from `from_rank`: one 1-d tensor of `dtype` and `numel`
  // elements (it may borrow the sender's memory: read it, never write it). `check`, when given,
  // also vets the content ("" or what is wrong; a compressed chunk's scales): a chunk it rejects
  // is dropped and counted as malformed like one of the wrong dtype.
  using ChunkCheck = std::function<std::string(const torch::Tensor&)>;
  torch::Tensor receiveChunk(Operation& op, int from_rank, uint64_t index, torch::ScalarType dtype,
                             int64_t numel, const ChunkCheck& check = nullptr);

  // Best effort, at most `timeout` per member: tells every other member this node leaves.
  void sendLeave(std::chrono::milliseconds timeout);
  // After a PeerLost: the member blamed (empty before any failure), and whether it announced
  // its leave rather than being found silent.
  const std::string& lostPeer() const { return loss_.peer; }
  bool lostByLeave() const { return !loss_.peer.empty() && loss_.cause == LossCause::kLeft; }
  // Who and how (the PeerLoss every PeerLost of this channel carries); peer empty before any.
  const PeerLoss& loss() const { return loss_; }

 private:
  std::chrono::milliseconds keepAliveInterval() const;
  void sendKeepAlives(Operation& op, int waiting_on);
  [[noreturn]] void fail(Operation& op, int lost_rank, LossCause cause, const std::string& why);
  // Why member `rank` is gone for good (ProcessGroupOptions::replaced, or kDisconnected for over
  // disconnected_grace); empty while it may still answer.
  std::string goneReason(int rank) const;
  // Throws Interrupted once ProcessGroupOptions::interrupted has said yes for interrupt_after.
  void checkInterrupted(const Operation& op, const char* waiting_for);
  [[noreturn]] void failLeft(Operation& op, int rank);
  void sendAborts(Operation& op, int lost_rank, bool left);
  // An abort or leave notice (node/protocol/CollectiveNotices.h): throws PeerLost for a valid
  // abort, or for a leave that ends this operation; counts and returns for a malformed one.
  void onNotice(Operation& op, const Message& m, int sender_rank, int wait_rank);
  void checkNotices(Operation& op, int to_rank);
  void waitForSendsToComplete(Operation& op);
  // One receiveChunk's wait: the chunk awaited, and the deadlines it runs under.
  struct ChunkWait {
    int from_rank;
    uint64_t index;
    torch::ScalarType dtype;
    int64_t numel;
    const ChunkCheck& check;
    std::chrono::steady_clock::time_point silent_deadline, hard_deadline, next_keep_alive;
    std::string peer_waits_on;  // what from_rank's last keep-alive said it waits for
  };
  void checkWait(Operation& op, ChunkWait& wait, std::chrono::steady_clock::time_point now);
  std::optional<Message> nextMessage(Operation& op, const ChunkWait& wait,
                                     std::chrono::steady_clock::time_point now);
  bool takeMessage(Operation& op, Message&& m, ChunkWait& wait, torch::Tensor* out);
  void onKeepAlive(const Message& m, int sender_rank, ChunkWait& wait);
  bool acceptStashed(Operation& op, int from_rank, uint64_t index, torch::ScalarType dtype,
                     int64_t numel, const ChunkCheck& check, torch::Tensor* out);
  bool acceptOne(Operation& op, const Message& m, int from_rank, uint64_t index,
                 torch::ScalarType dtype, int64_t numel, const ChunkCheck& check,
                 torch::Tensor* out);

  Mailbox& mailbox_;
  std::string group_id_;
  std::string wire_tag_;
  std::vector<std::string> members_;
  int rank_ = 0;
  ProcessGroupOptions options_;
  uint64_t next_sequence_ = 0;
  std::string broken_;        // non-empty after a failure: the PeerLost message every call repeats
  // When ProcessGroupOptions::interrupted first said yes during a wait (checkInterrupted).
  std::optional<std::chrono::steady_clock::time_point> stop_seen_;
  // When this group was made: a disconnection counts from here at the earliest (goneReason).
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  PeerLoss loss_;             // after a failure: the member blamed and why
  std::set<int> left_ranks_;  // members whose leave message arrived
  ProcessGroupStats stats_;
};

}  // namespace cairn
