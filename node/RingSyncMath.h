// RingSyncMath: what one sync computes over a ring's buckets, through the ring's ProcessGroup
// (RingClusterSync.h for the modes):
//   reduceBuckets     floating buckets averaged, integer/bool ones max-reduced (BatchNorm's
//                     num_batches_tracked: every copy counted the same batches, max keeps it exact)
//   outerStep         DiLoCo: Δ = θ_prev − θ_local averaged, outer SGD (lr, momentum, Nesterov as
//                     torch.optim.SGD) on θ_prev, θ_local ← θ_prev; buffers reduced as above
//   averageGradients  data-parallel: the floating parameters' gradients averaged (zeros where a
//                     parameter has none)
// Ownership: none (operates on the caller's buckets and group). Thread-safety: the ring's thread.
#pragma once

#include "node/ProcessGroup.h"
#include "node/RingBuckets.h"
#include "trainer/TrainOptions.h"

namespace cairn {

void reduceBuckets(RingBuckets& ring, ProcessGroup& group, bool parameters, bool buffers);
void outerStep(RingBuckets& ring, ProcessGroup& group, const SyncOptions& sync);
void averageGradients(RingBuckets& ring, ProcessGroup& group);

}  // namespace cairn
