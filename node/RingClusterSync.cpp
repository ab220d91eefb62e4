#include "node/RingClusterSync.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t fnv1a(uint64_t hash, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string endpointOf(const PeerRef& peer) {
  return peer.address.find("://") == std::string::npos ? "tcp://" + peer.address : peer.address;
}

}  // namespace

// One ring group: its ProcessGroup and the module tensors it brings together, cut into buckets of
// one dtype and role (parameters / buffers), each flattened into one all-reduce.
struct RingClusterSync::Ring {
  struct Bucket {
    torch::ScalarType dtype;
    bool parameters = false;
    std::vector<size_t> members;  // indices into tensors
    int64_t numel = 0;
    torch::Tensor previous;  // diloco: θ_prev, flat
    torch::Tensor momentum;  // diloco: outer momentum buffer, flat (undefined before the first)
  };
  RingSpec spec;
  std::unique_ptr<ProcessGroup> group;
  std::vector<torch::Tensor> tensors;  // alias the stage module's parameters and buffers
  std::vector<bool> is_parameter;
  std::vector<Bucket> buckets;

  torch::Tensor flatten(const Bucket& b, bool gradients) const {
    std::vector<torch::Tensor> parts;
    for (size_t i : b.members) {
      const torch::Tensor& t = tensors[i];
      torch::Tensor v = gradients ? (t.grad().defined() ? t.grad() : torch::zeros_like(t)) : t;
      parts.push_back(v.detach().reshape({-1}));
    }
    if (parts.empty()) return torch::empty({0}, torch::TensorOptions().dtype(b.dtype));
    return torch::cat(parts);
  }
  void unflatten(const Bucket& b, const torch::Tensor& flat, bool gradients) {
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
        else
          t.mutable_grad() = part.clone();
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
  std::string describe() const {
    std::ostringstream out;
    out << spec.id << " (";
    for (size_t i = 0; i < spec.parameters.size(); ++i) {
      if (i == 3) {
        out << ", … " << spec.parameters.size() << " tensors";
        break;
      }
      out << (i ? ", " : "") << spec.parameters[i];
    }
    out << ")";
    return out.str();
  }
};

RingClusterSync::RingClusterSync(Mailbox& mailbox, const NodeSpec& node, SyncOptions sync,
                                 int64_t local_steps, std::chrono::milliseconds timeout)
    : mailbox_(mailbox), node_(node), sync_(sync), local_steps_(std::max<int64_t>(1, local_steps)) {
  std::vector<RingSpec> specs = node.rings;
  std::sort(specs.begin(), specs.end(),
            [](const RingSpec& a, const RingSpec& b) { return a.id < b.id; });
  std::set<std::string> added;
  ProcessGroupOptions options;
  options.timeout = timeout;
  for (auto& spec : specs) {
    auto ring = std::make_unique<Ring>();
    ring->spec = spec;
    if (spec.members.size() > 1) {
      std::vector<std::string> names;
      for (const auto& m : spec.members) {
        names.push_back(m.name);
        if (m.name != node.name && added.insert(m.name).second)
          mailbox.transport().addPeer(m.name, endpointOf(m));
      }
      if (spec.rank < 0 || size_t(spec.rank) >= names.size() || names[size_t(spec.rank)] != node.name)
        CAIRN_THROW(BadInput, "node.json of ", node.name, ": ring ", spec.id, " rank ", spec.rank,
                    " does not name this node among its members");
      ring->group = std::make_unique<ProcessGroup>(mailbox, spec.id, names, node.name, options);
    }
    rings_.push_back(std::move(ring));
  }
}

RingClusterSync::~RingClusterSync() = default;

size_t RingClusterSync::activeRings() const {
  size_t n = 0;
  for (const auto& r : rings_) n += r->group ? 1 : 0;
  return n;
}

void RingClusterSync::start(torch::jit::Module& stage) {
  std::map<std::string, std::pair<torch::Tensor, bool>> state;
  for (const auto& p : stage.named_parameters(/*recurse=*/true)) state[p.name] = {p.value, true};
  for (const auto& b : stage.named_buffers(/*recurse=*/true)) state[b.name] = {b.value, false};
  size_t tensors = 0;
  int64_t bytes = 0;
  for (auto& ring : rings_) {
    if (!ring->group) continue;
    std::map<std::pair<int, bool>, size_t> bucket_of;
    for (const auto& name : ring->spec.parameters) {
      auto it = state.find(name);
      if (it == state.end())
        CAIRN_THROW(BadInput, "node.json of ", node_.name, ": ring ", ring->spec.id, " lists ",
                    name, ", which the stage module (", node_.stage_file,
                    ") has neither as a parameter nor as a buffer");
      const torch::Tensor& t = it->second.first;
      CAIRN_ENFORCE(t.device().is_cpu(), "ring tensors must be on the CPU: ", name);
      const size_t index = ring->tensors.size();
      ring->tensors.push_back(t);
      ring->is_parameter.push_back(it->second.second);
      const auto key = std::make_pair(int(t.scalar_type()), it->second.second);
      auto [b, fresh] = bucket_of.emplace(key, ring->buckets.size());
      if (fresh) {
        Ring::Bucket bucket;
        bucket.dtype = t.scalar_type();
        bucket.parameters = it->second.second;
        ring->buckets.push_back(bucket);
      }
      ring->buckets[b->second].members.push_back(index);
      ring->buckets[b->second].numel += t.numel();
      ++tensors;
      bytes += int64_t(t.numel() * t.element_size());
    }
    // Identical start: hash of names, dtypes, shapes and bytes, all-gathered.
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < ring->tensors.size(); ++i) {
      const std::string& name = ring->spec.parameters[i];
      hash = fnv1a(hash, name.data(), name.size());
      torch::Tensor t = ring->tensors[i].detach().contiguous();
      const int dtype = int(t.scalar_type());
      hash = fnv1a(hash, &dtype, sizeof dtype);
      for (int64_t d : t.sizes()) hash = fnv1a(hash, &d, sizeof d);
      hash = fnv1a(hash, t.data_ptr(), size_t(t.numel()) * t.element_size());
    }
    torch::Tensor mine = torch::tensor({int64_t(hash)}, torch::kLong);
    const auto t0 = Clock::now();
    std::vector<torch::Tensor> all = ring->group->allGather(mine);
    stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    const auto& members = ring->spec.members;
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].item<int64_t>() == all[0].item<int64_t>()) continue;
      CAIRN_THROW(BadInput, "ring ", ring->describe(), ": ", members[r].name, " (cluster ", r,
                  ") starts from different weights than ", members[0].name,
                  " (cluster 0): checksum ", uint64_t(all[r].item<int64_t>()), " vs ",
                  uint64_t(all[0].item<int64_t>()),
                  "; every cluster must start from the same stage weights (cut them from one "
                  "model with one clusterize run). Refusing to train.");
    }
    if (sync_.mode == SyncMode::kDiLoCo)
      for (auto& b : ring->buckets)
        if (b.parameters && at::isFloatingType(b.dtype)) b.previous = ring->flatten(b, false).clone();
  }
  started_ = true;
  if (activeRings() > 0) {
    std::ostringstream partners;
    for (const auto& ring : rings_) {
      if (!ring->group) continue;
      partners << " " << ring->spec.id << "[";
      bool first = true;
      for (const auto& m : ring->spec.members)
        if (m.name != node_.name) {
          partners << (first ? "" : ",") << m.name;
          first = false;
        }
      partners << "]";
    }
    CAIRN_INFO("cross-cluster sync: ", toString(sync_.mode), ", local_steps ", local_steps_, ", ",
               activeRings(), " ring(s):", partners.str(), "; ", tensors, " tensors, ", bytes,
               " bytes; identical initial weights verified");
  }
}

void RingClusterSync::reduceBuckets(Ring& ring, bool parameters, bool buffers) {
  for (auto& b : ring.buckets) {
    if (b.numel == 0 || (b.parameters ? !parameters : !buffers)) continue;
    torch::Tensor flat = ring.flatten(b, false);
    const bool floating = at::isFloatingType(b.dtype);
    ring.group->allReduce(flat, floating ? ReduceOp::kAverage : ReduceOp::kMax);
    ring.unflatten(b, flat, false);
  }
}

void RingClusterSync::outerStep(Ring& ring) {
  for (auto& b : ring.buckets) {
    if (b.numel == 0 || !b.parameters || !b.previous.defined()) continue;
    torch::NoGradGuard no_grad;
    torch::Tensor delta = b.previous - ring.flatten(b, false);
    ring.group->allReduce(delta, ReduceOp::kAverage);
    const double m = sync_.outer_momentum;
    torch::Tensor update = delta;
    if (m > 0) {
      if (!b.momentum.defined())
        b.momentum = delta.clone();
      else
        b.momentum.mul_(m).add_(delta);
      update = sync_.outer_nesterov ? delta.add(b.momentum, m) : b.momentum;
    }
    b.previous.add_(update, -sync_.outer_lr);
    ring.unflatten(b, b.previous, false);
  }
  reduceBuckets(ring, /*parameters=*/false, /*buffers=*/true);
}

void RingClusterSync::averageGradients(Ring& ring) {
  for (auto& b : ring.buckets) {
    if (b.numel == 0 || !b.parameters || !at::isFloatingType(b.dtype)) continue;
    torch::Tensor flat = ring.flatten(b, true);
    ring.group->allReduce(flat, ReduceOp::kAverage);
    ring.unflatten(b, flat, true);
  }
}

void RingClusterSync::synchronize() {
  CAIRN_ENFORCE(started_, "RingClusterSync::synchronize before start()");
  const auto t0 = Clock::now();
  for (auto& ring : rings_) {
    if (!ring->group) continue;
    switch (sync_.mode) {
      case SyncMode::kAverage:
        reduceBuckets(*ring, true, true);
        break;
      case SyncMode::kDiLoCo:
        outerStep(*ring);
        break;
      case SyncMode::kGradients:
        reduceBuckets(*ring, false, true);  // parameters are kept equal by the gradients
        break;
    }
  }
  ++stats_.syncs;
  stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  stats_.bytes_sent = 0;
  for (auto& ring : rings_)
    if (ring->group) stats_.bytes_sent += ring->group->stats().bytes_sent;
}

void RingClusterSync::beforeOptimizerStep(int64_t, torch::jit::Module&) {
  if (sync_.mode != SyncMode::kGradients || activeRings() == 0) return;
  const auto t0 = Clock::now();
  for (auto& ring : rings_)
    if (ring->group) averageGradients(*ring);
  ++stats_.gradient_syncs;
  stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void RingClusterSync::afterOptimizerStep(int64_t step, torch::jit::Module&) {
  const int64_t done = step + 1;
  if (activeRings() == 0 || done % local_steps_ != 0) return;
  synchronize();
  last_synced_step_ = done;
}

// TODO([E] ring failures): tell the ring peers; implemented on the issue-ring branch.
void RingClusterSync::leave() {}

void RingClusterSync::finish(int64_t steps, torch::jit::Module&) {
  if (activeRings() == 0) return;
  if (steps != last_synced_step_) synchronize();
  last_synced_step_ = steps;
  CAIRN_INFO("cross-cluster sync: ", stats_.syncs, " sync(s), ", stats_.gradient_syncs,
             " gradient all-reduce(s), ", stats_.seconds, " s, ", stats_.bytes_sent,
             " tensor bytes sent");
}

}  // namespace cairn
