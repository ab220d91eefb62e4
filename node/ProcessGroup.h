// ProcessGroup: the collectives PyTorch offers (all_reduce, broadcast, reduce, all_gather, gather,
// scatter, barrier) for an ordered group of named nodes, over a node's one Mailbox/Transport.
//
// What it is for: bringing together tensors that several nodes hold (parameters shared across
// clusters, gradients in data-parallel mode). Algorithms (docs/COLLECTIVES.md):
//   allReduce  bandwidth-optimal ring: reduce-scatter then all-gather, 2(n−1)/n × bytes sent per
//              node, cut into segments and pipelined (several segments in flight; the next one is
//              queued before the previous one is reduced), in place.
//   broadcast  pipelined chain from the root; reduce: pipelined chain ending at the root.
//   allGather  ring; gather/scatter: direct to/from the root; barrier: dissemination (log2 n).
//
// Messages: kind kCollective, tag "coll:<group id>", step = this group's operation sequence
// number, microbatch = the index of the message within the operation. Every member must call
// the same collectives in the same order (as with torch.distributed). A received chunk is
// validated (member sender, expected index, one tensor, dtype, element count) before use; a bad
// one is dropped and counted, never trusted. Messages of other groups, of later operations and
// of other kinds stay in the mailbox for whoever asks for them.
//
// Failure: every wait (for a chunk, or for room to send one) is bounded by `timeout`; past it the
// operation throws PeerLost naming the peer that did not answer, and tells the other members
// (an abort message) so that they fail promptly naming the same peer instead of waiting in turn.
// A member that has waited a quarter of the timeout tells the others it is alive and whom it
// waits for (a keep-alive), so that its neighbours blame the lost member, not it; no wait lasts
// more than twice the timeout. After a failure the group is broken: every later call throws the
// same PeerLost, and lostPeer() names the member blamed.
// Fail fast: when the transport reports the awaited member kDisconnected (Transport::liveness) for
// `disconnected_grace`, the wait ends at once as if the timeout had passed (same abort).
// Leave: sendLeave() tells every other member that this node is going away. A member that has it
// throws PeerLost naming the leaver (lostByLeave() true) as soon as it waits for a message the
// leaver did not send before leaving, or would send to it — never after a timeout — and forwards
// the leave to the others (who then fail at once); a leave from a member that already sent all
// this operation needs from it does not fail the operation.
//
// Ownership: borrows the Mailbox (and through it the transport), which must outlive the group and
// must already know every other member as a peer (Transport::addPeer). Thread-safety: one thread
// at a time per group. Several groups may share one Mailbox: run from one thread, their operations
// interleave safely as long as each node runs them in a compatible order; run from different
// threads at once (RingClusterSync's concurrent rings), they need no order at all, each taking
// its share of the in-flight window when they share a link (ProcessGroupOptions::max_in_flight).
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "node/Mailbox.h"

namespace cairn {

enum class ReduceOp {
  kSum,      // bool: logical or; integers: exact, wrapping like torch on overflow
  kAverage,  // sum / group size; floating dtypes only (BadInput otherwise)
  kMax,      // bool: logical or
  kMin,      // bool: logical and
};
const char* toString(ReduceOp op);

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
  // (capped at `timeout`). Transports that cannot tell (kUnknown) leave only the timeout.
  std::chrono::milliseconds disconnected_grace{1000};
};

struct ProcessGroupStats {
  uint64_t operations = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;     // accepted chunks
  uint64_t bytes_sent = 0;            // tensor bytes
  uint64_t dropped_malformed = 0;     // wrong dtype / size / tensor count, non-member sender
  uint64_t dropped_unexpected = 0;    // duplicates, indices the operation never expects
  uint64_t dropped_stale = 0;         // belonging to an operation this group already finished
  double seconds_receiving = 0;       // blocked waiting for chunks (includes decoding them)
  double seconds_sending = 0;         // handing chunks to the transport (waiting for room)
  double seconds_completing = 0;      // waiting for the transport to let go of the last chunks
};

class ProcessGroup {
 public:
  // `members` is the group in rank order (unique names, `self` among them). `group_id` names the
  // group on the wire: every member must use the same id, distinct from the other groups that
  // share a member's mailbox. Throws BadInput for an empty or too long id, duplicate members, or
  // a `self` that is not a member.
  ProcessGroup(Mailbox& mailbox, std::string group_id, std::vector<std::string> members,
               const std::string& self, ProcessGroupOptions options = {});

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::string& groupId() const { return group_id_; }
  const std::vector<std::string>& members() const { return members_; }
  const ProcessGroupStats& stats() const { return stats_; }

  // Every member ends with the reduction of all members' `tensor`, bit-identical everywhere.
  // float16/bfloat16 accumulate in float32 and are rounded once. Any shape; a non-contiguous
  // tensor is reduced through a contiguous copy and written back.
  void allReduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Every member ends with `root`'s tensor (same shape and dtype required everywhere).
  void broadcast(torch::Tensor& tensor, int root);
  // `root` ends with the reduction; the other members' tensors are left unchanged.
  void reduce(torch::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum);
  // Returns one tensor per rank (same shape and dtype required everywhere); [rank] is a copy of
  // `tensor`.
  std::vector<torch::Tensor> allGather(const torch::Tensor& tensor);
  // Root: one tensor per rank, as allGather. Others: an empty vector.
  std::vector<torch::Tensor> gather(const torch::Tensor& tensor, int root);
  // Root passes one tensor per rank (each the shape and dtype of `output`); every member's
  // `output` receives its own. Others pass an empty `inputs`.
  void scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs, int root);
  // Returns once every member has entered barrier().
  void barrier();

  // Best effort, at most `timeout` per member: tells every other member this node leaves the
  // group (a leave message). The group stays usable for this node (callers stop using it).
  void sendLeave(std::chrono::milliseconds timeout);
  // After a PeerLost: the member blamed (empty before any failure), and whether it announced
  // its leave rather than being found silent.
  const std::string& lostPeer() const { return lost_peer_; }
  bool lostByLeave() const { return lost_by_leave_; }

 private:
  struct Operation;

  Operation begin(const char* name);
  void finish(Operation& op);
  void checkTensor(const torch::Tensor& tensor, const char* what) const;
  void checkRoot(int root) const;
  void sendChunk(Operation& op, int to_rank, uint64_t index, const torch::Tensor& data);
  torch::Tensor receiveChunk(Operation& op, int from_rank, uint64_t index,
                             torch::ScalarType dtype, int64_t numel);
  std::chrono::milliseconds keepAliveInterval() const;
  void sendKeepAlives(Operation& op, int waiting_on);
  [[noreturn]] void fail(Operation& op, int lost_rank, const std::string& why);
  bool disconnectedTooLong(int rank) const;
  // Throws PeerLost for a valid abort or leave message `m` (from member `sender_rank`); counts and
  // returns for a malformed one.
  void failOnNotice(Operation& op, const Message& m, int sender_rank);
  [[noreturn]] void failLeft(Operation& op, int rank);
  void sendAborts(Operation& op, int lost_rank, bool left);
  void onLeaveNotice(Operation& op, const Message& m, int sender_rank, int wait_rank);
  void checkNotices(Operation& op, int to_rank);
  void waitForSendsToComplete(Operation& op);
  bool acceptStashed(Operation& op, int from_rank, uint64_t index, torch::ScalarType dtype,
                     int64_t numel, torch::Tensor* out);

  void ringAllReduce(Operation& op, torch::Tensor& flat, ReduceOp op_kind);

  Mailbox& mailbox_;
  std::string group_id_;
  std::string wire_tag_;
  std::vector<std::string> members_;
  int rank_ = 0;
  ProcessGroupOptions options_;
  uint64_t next_sequence_ = 0;
  std::string broken_;  // non-empty after a failure: the PeerLost message every call repeats
  std::string lost_peer_;
  bool lost_by_leave_ = false;
  std::set<int> left_ranks_;  // members whose leave message arrived
  ProcessGroupStats stats_;
};

}  // namespace cairn
