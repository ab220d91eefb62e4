// GradientOverlap: the "gradients" mode all-reduce overlapped with backward, as DDP does
// (docs/TRAINING.md "Overlap", docs/THREADS.md "Gradient overlap").
//
// Before the step's last backward, arm() readies every active ring: each of its parameters gets
// (once) a post hook on its AccumulateGrad node, and a communication thread per ring waits for its
// gradient buckets (RingBuckets::gradient_buckets, the same buckets the non-overlapped path
// reduces) in bucket order. A bucket is final when every parameter of it that requires a gradient
// has had its AccumulateGrad run in this backward; the thread then all-reduces it
// (averageGradientBucket, exactly as averageGradients does) while backward goes on with the
// earlier layers. complete(), after the backward, marks every bucket final (parameters backward
// never reached — unused in this step, or not requiring gradients — are reduced now, zeros where
// there is no gradient, like DDP's find_unused_parameters), waits for the thread and commits the
// ring's transaction (the barrier, RingTransaction.h).
//
// On a device whose copies run behind the host (a GPU: RingContext::placement, copiesLater), the
// hook that finishes a bucket also copies it out: it flattens the bucket where it lives and starts
// its copy to pinned host memory (and that of its weights' largest magnitudes, which the bucket's
// contribution check reads) without waiting — on the stream backward runs on, right behind the
// kernels that computed those gradients. The thread waits for that copy, not for the device: a
// copy the thread made itself would be queued behind everything backward had queued by then, so
// the all-reduce would start only when backward ends. The averaged buckets go back onto the
// device in complete(), after backward (a copy back during it would wait the same way). Same
// numbers, same messages (`RingClusterSyncOverlap.ABucketIsCopiedOutByTheBackwardThatFinishesIt`).
//
// Why a post hook on AccumulateGrad and not Tensor::register_hook: a tensor hook runs when the
// parameter's gradient has been computed but BEFORE it is accumulated into .grad (and may change
// it); the AccumulateGrad node's post hooks run after .grad has been written, and that node runs
// once per backward for a leaf, so nothing in this backward writes that .grad again — what the
// communication thread reads is final. (c10d's Reducer hooks the same node the same way.)
//
// Same collectives, same order: a member that overlaps and one that does not (a test calling
// beforeOptimizerStep alone, a ring with concurrent_rings off) send exactly the same messages, so
// nothing has to be agreed on before overlapping. Failures: a PeerLost on the communication thread
// ends its work at once (it never touches gradients backward may still write); complete() then
// drops the lost member, and the survivors vote as transact does (recover): the attempt stands,
// or every bucket reduced so far gets its pre-reduction gradients back and the sync is redone
// among the survivors through the ordinary transact path. Joiners are never admitted in a gradient
// sync (that is synchronize()'s business), so the view cannot change under the thread.
//
// Ownership: borrows the RingContext and the Rings (RingClusterSync owns all three and destroys
// this first); holds the AccumulateGrad nodes it hooked (keeping them alive, as c10d does) and
// removes its hooks when destroyed. Thread-safety: arm(), cancel(), forget() and the destructor on
// the trainer thread; complete() for different rings may run at once (RingThreads.h). The hooks
// run on the autograd thread and mark readiness under a mutex; a hook that copies a bucket out
// does so outside it, then hands the copy over under it.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "node/ring/RingState.h"

namespace cairn {

class GradientOverlap {
 public:
  explicit GradientOverlap(RingContext& context);
  ~GradientOverlap();
  GradientOverlap(const GradientOverlap&) = delete;
  GradientOverlap& operator=(const GradientOverlap&) = delete;

  // Before the step's last backward: hooks (first time, or after forget) and one communication
  // thread per ring in `rings` (each must have a ProcessGroup). Rings already armed stay armed.
  void arm(const std::vector<Ring*>& rings);
  bool armed(const Ring* ring) const;
  bool anyArmed() const;
  // After the backward: the rest of `ring`'s gradient sync, committed (or redone among the
  // survivors after a loss). Rethrows what the communication thread or the commit threw, other
  // than a PeerLost naming the lost member.
  void complete(Ring& ring);
  // Stops every armed ring's thread (after its collective in progress, bounded by the ring's
  // timeout) and disarms; gradients stay as far as they were reduced (buckets copied out in
  // backward: as they were). For leave() and errors.
  void cancel();
  // `ring` was rebuilt (its tensors gathered anew): its hooks are dropped, set again at next arm.
  void forget(const Ring* ring);

 private:
  struct Readiness;
  struct PerRing;
  void hook(PerRing& r);
  void unhook(PerRing& r);
  void stop(PerRing& r);

  RingContext& context_;
  std::map<const Ring*, std::unique_ptr<PerRing>> rings_;
};

}  // namespace cairn
