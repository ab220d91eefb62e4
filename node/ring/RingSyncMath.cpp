#include "node/ring/RingSyncMath.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

namespace {

constexpr const char* kCopy = "copy of the ring's parameters";
constexpr const char* kGradientContribution = "gradient contribution (gradients and weights)";

// Member `r` of `group` is corrupt (`why`): this node → BadInput; another → PeerLost naming it.
// `subject`: what of the member's was checked (kCopy, kGradientContribution).
[[noreturn]] void corrupt(const ProcessGroup& group, size_t r, const std::string& why,
                          const char* subject = kCopy) {
  const auto& members = group.members();
  if (int(r) == group.rank())
    CAIRN_THROW(BadInput, "this node's ", subject, " ", why,
                ": corrupt (a flipped bit, bad memory?); it must not be averaged or trained on");
  CAIRN_THROW_LOST((PeerLoss{members[r], LossCause::kAborted, "corrupt weights", members[r]}),
                   members[r], "'s ", subject, " ", why, ": dropped before the average");
}

// The last results' checksums (summary columns 2..4: has one, high and low 32 bits): a member
// outvoted by a strict majority of those that have one is corrupt; without a majority, a warning.
// `what`: what the checksum covers, for the messages.
void checkResults(const ProcessGroup& group, const std::vector<torch::Tensor>& all,
                  const std::string& what) {
  std::map<uint64_t, size_t> counts;
  size_t with = 0;
  auto sumOf = [&all](size_t r) {
    const auto s = all[r].accessor<double, 1>();
    return (uint64_t(s[3]) << 32) | uint64_t(s[4]);
  };
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r][2].item<double>() != 0) {
      ++counts[sumOf(r)];
      ++with;
    }
  if (counts.size() <= 1) return;
  const auto top = std::max_element(counts.begin(), counts.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
  if (2 * top->second <= with) {
    CAIRN_WARN("ring members' ", what, " differ (", counts.size(), " checksums among ", with,
               " members) and no majority names the corrupt copy; going on (the magnitude check "
               "still guards)");
    return;
  }
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r][2].item<double>() != 0 && sumOf(r) != top->first)
      corrupt(group, r,
              detail::concat("has its ", what, " hashing to ", sumOf(r), ", not the ", top->first,
                             " of ", top->second, " of the ", with, " members"));
}

}  // namespace

CopySummary summarizeCopy(const RingBuckets& ring,
                          const std::function<torch::Tensor(size_t)>& value_of) {
  CopySummary summary;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < ring.buckets.size(); ++i) {
    const RingBucket& b = ring.buckets[i];
    if (b.numel == 0 || !b.parameters || !at::isFloatingType(b.dtype)) continue;
    const torch::Tensor value = value_of(i);
    if (!value.defined()) continue;  // e.g. θ_prev outside DiLoCo
    const torch::Tensor flat = value.to(torch::kDouble);
    if (!torch::isfinite(flat).all().item<bool>()) summary.nonfinite = true;
    summary.largest =
        std::max(summary.largest, flat.abs().nan_to_num(0, 0, 0).max().item<double>());
  }
  return summary;
}

std::string corruptNextTo(const CopySummary& theirs, const CopySummary& mine,
                          const std::string& mine_is) {
  if (theirs.nonfinite) return "holds a non-finite weight";
  const double others = std::max(1.0, mine.largest);
  if (theirs.largest > kCorruptionFactor * others)
    return detail::concat("holds a weight of magnitude ", theirs.largest, ", over ",
                          kCorruptionFactor, "x ", mine_is, " (", others, ")");
  return "";
}

namespace {

// The magnitude rule over all-gathered summaries (one row per member, column 0 the non-finite
// flag): member r is corrupt when its flag is set, or when its value in one of `columns` exceeds
// kCorruptionFactor x max(1, every other member's value in that column). `what` names each column.
void checkMagnitudes(const ProcessGroup& group, const std::vector<torch::Tensor>& all,
                     const std::vector<std::pair<int64_t, std::string>>& columns,
                     const std::string& nonfinite_what, const char* subject) {
  // Every member non-finite at once is no corrupt copy but a diverged training: nobody can be
  // dropped for it, and averaging on would spread NaN; every member stops, saying so.
  size_t nonfinite = 0;
  for (const auto& row : all) nonfinite += row[0].item<double>() != 0 ? 1 : 0;
  if (all.size() > 1 && nonfinite == all.size())
    CAIRN_THROW(BadInput, "every member of ring ", group.groupId(), " (", all.size(), ") ",
                nonfinite_what, ": the training diverged (a learning rate too high?), not one "
                "corrupt copy; stopping rather than averaging non-finite values");
  for (size_t r = 0; r < all.size(); ++r) {
    const auto s = all[r].accessor<double, 1>();
    if (s[0] != 0) corrupt(group, r, nonfinite_what, subject);
    for (const auto& [c, what] : columns) {
      double others = 1;
      for (size_t o = 0; o < all.size(); ++o)
        if (o != r) others = std::max(others, all[o][c].item<double>());
      if (s[c] > kCorruptionFactor * others)
        corrupt(group, r,
                detail::concat("holds a ", what, " of magnitude ", s[c], ", over ",
                               kCorruptionFactor, "x every other member's largest (", others, ")"),
                subject);
    }
  }
}

// The largest magnitude of each of `tensors` that has elements, computed where they live, as one
// float64 tensor there: one pass over each in its own dtype (max propagates NaN, and an infinity
// is the largest), so it costs about one copy of the bucket per step; a largest is one of the
// tensor's values, which widening to double keeps exactly.
torch::Tensor largestMagnitudes(const std::vector<torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> largest;
  for (const torch::Tensor& t : tensors)
    if (t.numel() > 0) largest.push_back(t.detach().abs().max().reshape({1}).to(torch::kDouble));
  if (largest.empty()) return torch::empty({0}, torch::kDouble);
  return torch::cat(largest);
}

// Whether any of `values` (largestMagnitudes) is not finite, and the largest of the others; the
// values cross to the host in one copy (on a GPU one wait for the device, not one per tensor).
std::pair<bool, double> summarizeLargest(const torch::Tensor& values) {
  const torch::Tensor host = values.to(torch::kCPU).contiguous();
  bool nonfinite = false;
  double out = 0;
  for (int64_t i = 0; i < host.numel(); ++i) {
    const double v = host.data_ptr<double>()[i];
    if (!std::isfinite(v))
      nonfinite = true;
    else
      out = std::max(out, v);
  }
  return {nonfinite, out};
}

}  // namespace

void checkContributions(RingBuckets& ring, ProcessGroup& group, std::optional<uint64_t> last_result,
                        const std::string& result_what) {
  CopySummary mine =
      summarizeCopy(ring, [&ring](size_t i) { return ring.flatten(ring.buckets[i], false); });
  // DiLoCo averages θ_prev − θ_local: a corrupt θ_prev spreads as surely as a corrupt weight.
  const CopySummary outer = summarizeCopy(ring, [&ring](size_t i) { return ring.buckets[i].previous; });
  mine.nonfinite = mine.nonfinite || outer.nonfinite;
  mine.largest = std::max(mine.largest, outer.largest);
  const double nonfinite = mine.nonfinite ? 1 : 0, largest = mine.largest;
  const uint64_t sum = last_result.value_or(0);
  const std::vector<torch::Tensor> all = group.allGather(
      torch::tensor({nonfinite, largest, last_result ? 1.0 : 0.0, double(sum >> 32),
                     double(sum & 0xffffffffull)},
                    torch::kDouble));
  checkMagnitudes(group, all, {{1, "weight"}}, "holds a non-finite weight", kCopy);
  checkResults(group, all, result_what);
}

torch::Tensor bucketWeightMagnitudes(const RingBuckets& ring, const RingBucket& b) {
  std::vector<torch::Tensor> weights;
  for (size_t i : b.members) weights.push_back(ring.tensors[i]);
  return largestMagnitudes(weights);
}

void checkGradientContribution(RingBuckets& ring, ProcessGroup& group, const RingBucket& b,
                               const torch::Tensor& gradients, const torch::Tensor* weight_largest) {
  torch::NoGradGuard no_grad;
  auto [nonfinite, largest_gradient] = summarizeLargest(largestMagnitudes({gradients}));
  const auto [bad_weight, largest_weight] =
      summarizeLargest(weight_largest ? *weight_largest : bucketWeightMagnitudes(ring, b));
  nonfinite = nonfinite || bad_weight;
  const std::vector<torch::Tensor> all = group.allGather(
      torch::tensor({nonfinite ? 1.0 : 0.0, largest_gradient, largest_weight}, torch::kDouble));
  checkMagnitudes(group, all, {{1, "gradient"}, {2, "weight"}},
                  "holds a non-finite gradient or weight", kGradientContribution);
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
    // Every product is its own correctly rounded op, never fused into an add (`add(x, alpha)` is
    // an FMA in ATen's AVX2 kernels and a multiply-then-add in its default ones): members on
    // different CPUs (or devices) then compute bit-identical outer states, which the outer-state
    // checksum (checkContributions) requires.
    const double m = sync.outer_momentum;
    torch::Tensor update = delta;
    if (m > 0) {
      if (!b.momentum.defined()) {
        b.momentum = delta.clone();
      } else {
        b.momentum.mul_(m);
        b.momentum.add_(delta);
      }
      update = sync.outer_nesterov ? delta + b.momentum * m : b.momentum;
    }
    b.previous.sub_(update * sync.outer_lr);
    ring.unflatten(b, b.previous, false);
  }
  reduceBuckets(ring, group, /*parameters=*/false, /*buffers=*/true);
}

void averageGradientBucket(RingBuckets& ring, ProcessGroup& group, size_t i,
                           torch::Tensor* before) {
  const RingBucket& b = ring.gradient_buckets.at(i);
  torch::Tensor flat = ring.flatten(b, true);
  averageFlatGradients(ring, group, b, flat, before);
  ring.unflatten(b, flat, true);
}

void averageFlatGradients(RingBuckets& ring, ProcessGroup& group, const RingBucket& b,
                          torch::Tensor& flat, torch::Tensor* before,
                          const torch::Tensor* weight_largest) {
  checkGradientContribution(ring, group, b, flat, weight_largest);
  if (before) *before = flat.clone();
  group.allReduce(flat, ReduceOp::kAverage);
}

void averageGradients(RingBuckets& ring, ProcessGroup& group) {
  for (size_t i = 0; i < ring.gradient_buckets.size(); ++i) averageGradientBucket(ring, group, i);
}

}  // namespace cairn
