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
//   Small groups (ProcessGroupOptions::direct_max_members, default 16) exchange directly where the
//   ring costs latency: allReduce of a tensor whose blocks fit one segment is a direct
//   reduce-scatter (block b to member b) then a direct all-gather — the same bytes per member as
//   the ring, 2 message delays instead of 2(n−1); a tensor of at most 64 bytes is sent whole to
//   every member, which all reduce it themselves (1 delay) — and barrier is one round of n−1
//   messages.
//
// Messages, validation, timeouts, keep-alives, aborts and leaves: CollectiveChannel.h (the group's
// one channel). Every member must call the same collectives in the same order (as with
// torch.distributed). Element-wise reductions per dtype: ReduceMath.h.
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
#include <string>
#include <vector>

#include "node/collectives/CollectiveChannel.h"
#include "node/transport/Mailbox.h"
#include "node/collectives/ReduceMath.h"

namespace cairn {

class ProcessGroup {
 public:
  // `members` is the group in rank order (unique names, `self` among them). `group_id` names the
  // group on the wire: every member must use the same id, distinct from the other groups that
  // share a member's mailbox. Throws BadInput for an empty or too long id, duplicate members, or
  // a `self` that is not a member.
  ProcessGroup(Mailbox& mailbox, std::string group_id, std::vector<std::string> members,
               const std::string& self, ProcessGroupOptions options = {});

  int rank() const { return channel_.rank(); }
  int size() const { return channel_.size(); }
  const std::string& groupId() const { return channel_.groupId(); }
  const std::vector<std::string>& members() const { return channel_.members(); }
  const ProcessGroupStats& stats() const { return channel_.stats(); }

  // Every member ends with the reduction of all members' `tensor`, bit-identical everywhere.
  // float16/bfloat16 accumulate in float32 and are rounded once. Any shape; a non-contiguous
  // tensor is reduced through a contiguous copy and written back.
  // ProcessGroupOptions::codec: how the chunks of a float32 kSum/kAverage travel (ReduceMath.h
  // ChunkCodec; other dtypes and operators ignore it and travel as always). With
  // kBf16/kInt8 each reduce-scatter hop sends its float32 partial encoded, the receiver decodes
  // it and adds its own float32 values; the member finishing a block encodes the result once and
  // adopts the decoded values itself, and the all-gather forwards those bytes unchanged: every
  // member still ends bit-identical (docs/COLLECTIVES.md "Compressed chunks").
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
  void sendLeave(std::chrono::milliseconds timeout) { channel_.sendLeave(timeout); }
  // After a PeerLost: the member blamed (empty before any failure), and whether it announced
  // its leave rather than being found silent.
  const std::string& lostPeer() const { return channel_.lostPeer(); }
  bool lostByLeave() const { return channel_.lostByLeave(); }

 private:
  using Operation = CollectiveChannel::Operation;

  void checkTensor(const torch::Tensor& tensor, const char* what) const;
  void checkRoot(int root) const;
  // Elements of `element_size` bytes in one segment (ProcessGroupOptions::segment_bytes).
  int64_t segmentElements(int64_t element_size) const;
  // The pipelined ring, one loop whose chunks travel plain (codec kFp32: in the tensor's dtype)
  // or encoded by `codec` (ProcessGroupAllReduce.cpp).
  void ringAllReduce(Operation& op, torch::Tensor& flat, ReduceOp op_kind, ChunkCodec codec);
  // Direct exchanges (ProcessGroupOptions::direct_max_members, docs/COLLECTIVES.md "Direct
  // exchanges"): whether this group uses them, and the direct all-reduce (codec kFp32: chunks
  // travel in the tensor's dtype).
  bool direct() const;
  void directAllReduce(Operation& op, torch::Tensor& flat, ReduceOp op_kind, ChunkCodec codec);
  void wholeExchangeAllReduce(Operation& op, torch::Tensor& flat, ReduceOp op_kind);

  CollectiveChannel channel_;
};

}  // namespace cairn
