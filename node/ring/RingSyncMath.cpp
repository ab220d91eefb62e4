#include "node/ring/RingSyncMath.h"

#include <algorithm>
#include <string>

#include "core/Error.h"

namespace cairn {

void checkContributions(RingBuckets& ring, ProcessGroup& group) {
  double nonfinite = 0, largest = 0;
  torch::NoGradGuard no_grad;
  for (const auto& b : ring.buckets) {
    if (b.numel == 0 || !b.parameters || !at::isFloatingType(b.dtype)) continue;
    const torch::Tensor flat = ring.flatten(b, false).to(torch::kDouble);
    if (!torch::isfinite(flat).all().item<bool>()) nonfinite = 1;
    largest = std::max(largest, flat.abs().nan_to_num(0, 0, 0).max().item<double>());
  }
  const std::vector<torch::Tensor> all =
      group.allGather(torch::tensor({nonfinite, largest}, torch::kDouble));
  const auto& members = group.members();
  for (size_t r = 0; r < all.size(); ++r) {
    const auto s = all[r].accessor<double, 1>();
    double others = 1;
    for (size_t o = 0; o < all.size(); ++o)
      if (o != r) others = std::max(others, all[o][1].item<double>());
    const bool corrupt = s[0] != 0 || s[1] > kCorruptionFactor * others;
    if (!corrupt) continue;
    const std::string why = s[0] != 0 ? "holds a non-finite weight"
                                      : detail::concat("holds a weight of magnitude ", s[1],
                                                       ", over ", kCorruptionFactor,
                                                       "x every other member's largest (", others, ")");
    if (int(r) == group.rank())
      CAIRN_THROW(BadInput, "this node's copy of the ring's parameters ", why,
                  ": corrupt (a flipped bit, bad memory?); it must not be averaged or trained on");
    CAIRN_THROW_LOST((PeerLoss{members[r], LossCause::kAborted, "corrupt weights", members[r]}),
                     members[r], "'s copy of the ring's parameters ", why,
                     ": dropped before the average");
  }
}

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
