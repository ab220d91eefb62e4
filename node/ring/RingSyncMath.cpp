#include "node/ring/RingSyncMath.h"

namespace cairn {

void reduceBuckets(RingBuckets& ring, ProcessGroup& group, bool parameters, bool buffers) {
  for (auto& b : ring.buckets) {
    if (b.numel == 0 || (b.parameters ? !parameters : !buffers)) continue;
    torch::Tensor flat = ring.flatten(b, false);
    const bool floating = at::isFloatingType(b.dtype);
    group.allReduce(flat, floating ? ReduceOp::kAverage : ReduceOp::kMax);
    ring.unflatten(b, flat, false);
  }
}

void outerStep(RingBuckets& ring, ProcessGroup& group, const SyncOptions& sync) {
  for (auto& b : ring.buckets) {
    if (b.numel == 0 || !b.parameters || !b.previous.defined()) continue;
    torch::NoGradGuard no_grad;
    torch::Tensor delta = b.previous - ring.flatten(b, false);
    group.allReduce(delta, ReduceOp::kAverage);
    const double m = sync.outer_momentum;
    torch::Tensor update = delta;
    if (m > 0) {
      if (!b.momentum.defined())
        b.momentum = delta.clone();
      else
        b.momentum.mul_(m).add_(delta);
      update = sync.outer_nesterov ? delta.add(b.momentum, m) : b.momentum;
    }
    b.previous.add_(update, -sync.outer_lr);
    ring.unflatten(b, b.previous, false);
  }
  reduceBuckets(ring, group, /*parameters=*/false, /*buffers=*/true);
}

void averageGradientBucket(RingBuckets& ring, ProcessGroup& group, size_t i,
                           torch::Tensor* before) {
  const RingBucket& b = ring.gradient_buckets.at(i);
  torch::Tensor flat = ring.flatten(b, true);
  if (before) *before = flat.clone();
  group.allReduce(flat, ReduceOp::kAverage);
  ring.unflatten(b, flat, true);
}

void averageGradients(RingBuckets& ring, ProcessGroup& group) {
  for (size_t i = 0; i < ring.gradient_buckets.size(); ++i) averageGradientBucket(ring, group, i);
}

}  // namespace cairn
