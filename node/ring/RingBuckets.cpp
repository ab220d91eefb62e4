#include "node/ring/RingBuckets.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/Error.h"
#include "core/Fnv.h"

namespace cairn {

void RingBuckets::build(const std::vector<std::string>& names, torch::jit::Module& stage,
                        const std::string& node, const std::string& ring_id,
                        const std::string& stage_file, bool diloco) {
  std::map<std::string, std::pair<torch::Tensor, bool>> state;
  for (const auto& p : stage.named_parameters(/*recurse=*/true)) state[p.name] = {p.value, true};
  for (const auto& b : stage.named_buffers(/*recurse=*/true)) state[b.name] = {b.value, false};
  tensors.clear();
  is_parameter.clear();
  buckets.clear();
  std::map<std::pair<int, bool>, size_t> bucket_of;
  // A tensor tied under two names (a GPT's embedding and head in one stage) is one tensor: it
  // keeps its place in `tensors` under each name (the checksum covers both) but joins a bucket
  // once, so it is reduced, averaged or stepped (DiLoCo's outer step) once per sync.
  std::set<const c10::TensorImpl*> bucketed;
  for (const auto& name : names) {
    auto it = state.find(name);
    if (it == state.end())
      CAIRN_THROW(BadInput, "node.json of ", node, ": ring ", ring_id, " lists ", name,
                  ", which the stage module (", stage_file,
                  ") has neither as a parameter nor as a buffer");
    const torch::Tensor& t = it->second.first;  // on the training device (see the header)
    const size_t index = tensors.size();
    tensors.push_back(t);
    is_parameter.push_back(it->second.second);
    if (!bucketed.insert(t.unsafeGetTensorImpl()).second) continue;
    const auto key = std::make_pair(int(t.scalar_type()), it->second.second);
    auto [b, fresh] = bucket_of.emplace(key, buckets.size());
    if (fresh) {
      RingBucket bucket;
      bucket.dtype = t.scalar_type();
      bucket.parameters = it->second.second;
      buckets.push_back(bucket);
    }
    buckets[b->second].members.push_back(index);
    buckets[b->second].numel += t.numel();
  }
  if (diloco)
    for (auto& b : buckets)
      if (b.parameters && at::isFloatingType(b.dtype)) b.previous = flatten(b, false).clone();
  gradient_buckets.clear();
  for (const auto& whole : buckets) {
    if (!whole.parameters || !at::isFloatingType(whole.dtype) || whole.numel == 0) continue;
    RingBucket cut;
    int64_t bytes = 0;
    auto close = [&] {
      std::reverse(cut.members.begin(), cut.members.end());  // node.json's order inside
      gradient_buckets.push_back(cut);
      cut = RingBucket();
      bytes = 0;
    };
    for (auto it = whole.members.rbegin(); it != whole.members.rend(); ++it) {
      const torch::Tensor& t = tensors[*it];
      const int64_t size = t.numel() * int64_t(t.element_size());
      if (!cut.members.empty() && gradient_bucket_bytes > 0 && bytes + size > gradient_bucket_bytes)
        close();
      cut.dtype = whole.dtype;
      cut.parameters = true;
      cut.members.push_back(*it);
      cut.numel += t.numel();
      bytes += size;
    }
    if (!cut.members.empty()) close();
  }
}

torch::Tensor RingBuckets::flatten(const RingBucket& b, bool gradients) const {
  // Rings reduce host buffers: a stage training on a GPU copies its bucket out here (one copy
  // per bucket) and unflatten's copy_ takes the result back onto the device.
  return flattenInPlace(b, gradients).to(torch::kCPU);
}

torch::Tensor RingBuckets::flattenInPlace(const RingBucket& b, bool gradients) const {
  std::vector<torch::Tensor> parts;
  for (size_t i : b.members) {
    const torch::Tensor& t = tensors[i];
    torch::Tensor v = gradients ? (t.grad().defined() ? t.grad() : torch::zeros_like(t)) : t;
    parts.push_back(v.detach().reshape({-1}));
  }
  if (parts.empty()) return torch::empty({0}, torch::TensorOptions().dtype(b.dtype));
  return torch::cat(parts);
}

void RingBuckets::unflatten(const RingBucket& b, const torch::Tensor& flat, bool gradients) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (size_t i : b.members) {
    torch::Tensor& t = tensors[i];
    const int64_t n = t.numel();
    torch::Tensor part = flat.narrow(0, offset, n).view(t.sizes());
    offset += n;
    if (gradients) {
      if (t.grad().defined())
        t.mutable_grad().copy_(part);
      else  // a gradient of its own, where the parameter is
        t.mutable_grad() = part.to(t.device(), t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    } else if (is_parameter[i]) {
      t.copy_(part);
    } else {
      // Buffers (BatchNorm running statistics) are saved by the autograd graphs of micro-batches
      // still in flight under the async schedule; their backward never reads them in training
      // mode, but a copy_ would bump the version counter and make that backward throw. Write
      // through variable_data() (Python's .data: same storage, its own version counter), as
      // BatchNorm's own in-place update of the statistics does.
      t.variable_data().copy_(part);
    }
  }
}

namespace {

uint64_t hashTensors(const std::vector<torch::Tensor>& tensors, const std::vector<std::string>& names,
                     bool words) {
  uint64_t hash = kFnvOffset;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& name = names[i];
    hash = fnv1a(hash, name.data(), name.size());
    torch::Tensor t = tensors[i].detach().to(torch::kCPU).contiguous();
    const int dtype = int(t.scalar_type());
    hash = fnv1a(hash, &dtype, sizeof dtype);
    for (int64_t d : t.sizes()) hash = fnv1a(hash, &d, sizeof d);
    const size_t bytes = size_t(t.numel()) * t.element_size();
    hash = words ? fnv1aWords(hash, t.data_ptr(), bytes) : fnv1a(hash, t.data_ptr(), bytes);
  }
  return hash;
}

}  // namespace

uint64_t RingBuckets::checksum(const std::vector<std::string>& names) const {
  return hashTensors(tensors, names, false);
}

uint64_t RingBuckets::resultChecksum(const std::vector<std::string>& names) const {
  return hashTensors(tensors, names, true);
}

uint64_t RingBuckets::outerStateChecksum() const {
  uint64_t hash = kFnvOffset;
  for (size_t i = 0; i < buckets.size(); ++i)
    for (int which = 0; which < 2; ++which) {
      const torch::Tensor& t = which == 0 ? buckets[i].previous : buckets[i].momentum;
      if (!t.defined()) continue;
      const uint64_t tag[2] = {uint64_t(i), uint64_t(which)};
      hash = fnv1a(hash, tag, sizeof tag);
      const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
      hash = fnv1aWords(hash, c.data_ptr(), size_t(c.numel()) * c.element_size());
    }
  return hash;
}

}  // namespace cairn
