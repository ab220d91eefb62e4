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
// Ownership: none (operates on the caller's buckets and group). Thread-safety: the ring's thread.
#pragma once

#include "node/collectives/ProcessGroup.h"
#include "node/ring/RingBuckets.h"
#include "trainer/TrainOptions.h"

namespace cairn {

void reduceBuckets(RingBuckets& ring, ProcessGroup& group, bool parameters, bool buffers);
void outerStep(RingBuckets& ring, ProcessGroup& group, const SyncOptions& sync);
void averageGradients(RingBuckets& ring, ProcessGroup& group);
// Gradient bucket `i`. `before`: if not null, receives the bucket's flat gradients before the
// reduction (the overlapped path's restore point).
void averageGradientBucket(RingBuckets& ring, ProcessGroup& group, size_t i,
                           torch::Tensor* before = nullptr);

}  // namespace cairn
