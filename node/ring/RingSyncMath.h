// RingSyncMath: what one sync computes over a ring's buckets, through the ring's ProcessGroup
// (RingClusterSync.h for the modes):
//   reduceBuckets     floating buckets averaged, integer/bool ones max-reduced (BatchNorm's
//                     num_batches_tracked: every copy counted the same batches, max keeps it exact)
//   outerStep         DiLoCo: Δ = θ_prev − θ_local averaged, outer SGD (lr, momentum, Nesterov as
//                     torch.optim.SGD) on θ_prev, θ_local ← θ_prev; buffers reduced as above
//   averageGradients  data-parallel: the floating parameters' gradients averaged (zeros where a
//                     parameter has none), gradient bucket by gradient bucket (RingBuckets.h), in
//                     order; averageGradientBucket is one of them (the overlapped path runs the same
//                     buckets one at a time, so both give bit-identical results)
//   checkContributions  before an average or DiLoCo step: every member's floating parameters are
//                     checked against the ring's (below), so a silently corrupted copy (a flipped
//                     exponent bit) is dropped before it is averaged into everyone's weights
//   checkGradientContribution  the same per gradient bucket, before its average ("gradients")
// Ownership: none (operates on the caller's buckets and group). Thread-safety: the ring's thread.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "node/collectives/ProcessGroup.h"
#include "node/ring/RingBuckets.h"
#include "trainer/TrainOptions.h"

namespace cairn {

// Every member's floating parameters, summarised (non-finite or not, the largest magnitude) and
// all-gathered. A member whose copy holds a non-finite value, or whose largest magnitude exceeds
// kCorruptionFactor x max(1, the largest of every other member), is corrupt: members start each
// sync interval from one average and drift by a few local steps, never by three orders of
// magnitude, while a flipped high exponent bit makes a weight infinite, NaN or ~1e38. This node
// corrupt: BadInput (it must not train on; provider --join exits and its node goes to a spare).
// Another corrupt: PeerLost naming it (kAborted), which the transaction takes as a loss: dropped,
// and the sync redone among the others (every member gathers the same summaries, so every
// survivor names the same member).
// `last_result`: a checksum bit-identical on every member unless a copy was corrupted — "average"
// mode: Ring::result_sum, this node's tensors as its last average left them (a copy corrupted
// after that average's check, during the reduction or while it was written back); DiLoCo:
// RingBuckets::outerStateChecksum now (θ_prev and momentum, which only the outer steps write,
// the same way on every member: a flip in them since, or in an outer step's result). The
// checksums are gathered with the summaries; a member outvoted by a strict majority of the members
// that have one is corrupt as above (an average's is caught at the sync after the one it was
// corrupted in); two members that differ, or a split without a majority, are logged (nobody can
// tell which copy is wrong); `result_what` names what the checksum covers in those messages.
// In DiLoCo the magnitude check covers θ_prev too (its difference to θ_local is what is averaged).
constexpr double kCorruptionFactor = 1000;

// One copy's floating parameters summarised for the checks above: any non-finite value, and the
// largest finite magnitude. `value_of(i)`: bucket i's flat values (RingBuckets::flatten, or the
// value.<i> of a welcome, or θ_prev); an undefined tensor is skipped.
struct CopySummary {
  bool nonfinite = false;
  double largest = 0;
};
CopySummary summarizeCopy(const RingBuckets& ring,
                          const std::function<torch::Tensor(size_t)>& value_of);
// Why `theirs` is corrupt next to `mine` by the rule above (empty when it is not); `mine_is` names
// `mine`'s largest in the sentence. A welcome is checked this way against the joiner's own copy
// before it is taken, and the joiner's own copy against the welcome's (RingMembership.cpp).
std::string corruptNextTo(const CopySummary& theirs, const CopySummary& mine,
                          const std::string& mine_is = "this node's own largest");
void checkContributions(RingBuckets& ring, ProcessGroup& group,
                        std::optional<uint64_t> last_result = std::nullopt,
                        const std::string& result_what = "result of the last average");
// "gradients": gradient bucket `b`'s contribution, its flat `gradients` and the weights of its
// parameters (the copies a flipped bit corrupts; they are equal on every member, being kept equal
// by the averaged gradients), summarised (non-finite or not, the largest magnitude of each) and
// all-gathered right before the bucket is averaged — by averageGradientBucket, so the ordinary and
// the overlapped path send the same messages. The rule is checkContributions' (a gradient larger
// than kCorruptionFactor x max(1, every other member's largest) is corrupt: members differ only by
// their micro-batches), with the same consequences: this node corrupt → BadInput, another →
// PeerLost naming it, and the gradient sync is redone among the others from their own gradients.
// `weight_largest`: bucketWeightMagnitudes(ring, b) already on the host (the overlapped path
// copies them out with the bucket, while backward runs); null: computed and read here.
void checkGradientContribution(RingBuckets& ring, ProcessGroup& group, const RingBucket& b,
                               const torch::Tensor& gradients,
                               const torch::Tensor* weight_largest = nullptr);
// The largest magnitude of each weight of gradient bucket `b` that has elements, computed where
// the weights live, as one float64 tensor there (max propagates NaN, and an infinity is the
// largest): what checkGradientContribution summarises, after one copy to the host.
torch::Tensor bucketWeightMagnitudes(const RingBuckets& ring, const RingBucket& b);
void reduceBuckets(RingBuckets& ring, ProcessGroup& group, bool parameters, bool buffers);
void outerStep(RingBuckets& ring, ProcessGroup& group, const SyncOptions& sync);
void averageGradients(RingBuckets& ring, ProcessGroup& group);
// Gradient bucket `i`, its contribution checked first (checkGradientContribution). `before`: if
// not null, receives the bucket's flat gradients before the reduction (the overlapped path's
// restore point).
void averageGradientBucket(RingBuckets& ring, ProcessGroup& group, size_t i,
                           torch::Tensor* before = nullptr);
// What averageGradientBucket does between its flatten and its unflatten: gradient bucket `b`'s
// flat host gradients `flat` checked, kept in `before` (if not null) and averaged in place, not
// written back. The overlapped path on a GPU, which copied `flat` (and `weight_largest`, as
// checkGradientContribution takes it) out during backward, writes the results back after it.
void averageFlatGradients(RingBuckets& ring, ProcessGroup& group, const RingBucket& b,
                          torch::Tensor& flat, torch::Tensor* before = nullptr,
                          const torch::Tensor* weight_largest = nullptr);

}  // namespace cairn
