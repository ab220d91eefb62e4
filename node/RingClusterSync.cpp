#include "node/RingClusterSync.h"

#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

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

// Control messages of the ring membership protocol (docs/PROTOCOL.md "Ring membership").
std::string controlTag(const std::string& ring_id) { return "ring:" + ring_id; }
constexpr std::chrono::milliseconds kLeaveSendTimeout{100};
constexpr std::chrono::milliseconds kJoinRequestSendTimeout{200};

std::string groupIdOf(const std::string& ring_id, int64_t generation) {
  return generation == 0 ? ring_id : ring_id + "@" + std::to_string(generation);
}

// Generation of a collective tag "coll:<ring>[@<g>]" of ring `ring_id`; -1 for other tags.
int64_t generationOfTag(const std::string& tag, const std::string& ring_id) {
  const std::string prefix = "coll:" + ring_id;
  if (tag.compare(0, prefix.size(), prefix) != 0) return -1;
  if (tag.size() == prefix.size()) return 0;
  if (tag[prefix.size()] != '@' || tag.size() == prefix.size() + 1) return -1;
  int64_t g = 0;
  for (size_t i = prefix.size() + 1; i < tag.size(); ++i) {
    if (tag[i] < '0' || tag[i] > '9' || g > (int64_t(1) << 40)) return -1;
    g = g * 10 + (tag[i] - '0');
  }
  return g;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return "[" + out + "]";
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
  std::vector<std::string> view;  // live members, cluster order
  int64_t generation = 0;
  std::unique_ptr<ProcessGroup> group;  // null while the view is this node alone
  std::set<std::string> join_requests;  // members that asked to be admitted
  int64_t transactions = 0;  // syncs of this ring committed (or kept) by this node
  bool alone_logged = false;
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
    : mailbox_(mailbox),
      timeout_(timeout),
      node_(node),
      sync_(sync),
      local_steps_(std::max<int64_t>(1, local_steps)) {
  std::vector<RingSpec> specs = node.rings;
  std::sort(specs.begin(), specs.end(),
            [](const RingSpec& a, const RingSpec& b) { return a.id < b.id; });
  std::set<std::string> added;
  group_options_.timeout = timeout;
  // Concurrent rings that share a link share its queues: each keeps a proportional share of the
  // in-flight window (see the header).
  const int shared_rings = static_cast<int>(std::count_if(
      specs.begin(), specs.end(), [](const RingSpec& s) { return s.members.size() > 1; }));
  if (sync_.concurrent_rings && shared_rings > 1)
    group_options_.max_in_flight = std::max(1, group_options_.max_in_flight / shared_rings);
  for (auto& spec : specs) {
    auto ring = std::make_unique<Ring>();
    ring->spec = spec;
    std::vector<std::string> names;
    for (const auto& m : spec.members) {
      names.push_back(m.name);
      if (m.name != node.name && added.insert(m.name).second)
        mailbox.transport().addPeer(m.name, endpointOf(m));
    }
    if (spec.members.size() > 1 &&
        (spec.rank < 0 || size_t(spec.rank) >= names.size() || names[size_t(spec.rank)] != node.name))
      CAIRN_THROW(BadInput, "node.json of ", node.name, ": ring ", spec.id, " rank ", spec.rank,
                  " does not name this node among its members");
    if (spec.members.size() <= 1) names = {node.name};
    regroup(*ring, names, 0);
    rings_.push_back(std::move(ring));
  }
}

RingClusterSync::~RingClusterSync() = default;

size_t RingClusterSync::activeRings() const {
  size_t n = 0;
  for (const auto& r : rings_) n += r->group ? 1 : 0;
  return n;
}

std::vector<std::string> RingClusterSync::view(const std::string& id) const {
  for (const auto& r : rings_)
    if (r->spec.id == id) return r->view;
  CAIRN_THROW(BadInput, "no ring ", id, " at node ", node_.name);
}

int64_t RingClusterSync::generation(const std::string& id) const {
  for (const auto& r : rings_)
    if (r->spec.id == id) return r->generation;
  CAIRN_THROW(BadInput, "no ring ", id, " at node ", node_.name);
}

// A new view/generation: a fresh ProcessGroup (or none when alone), and what is left in the
// mailbox of this ring's earlier generations thrown away (best effort: what arrives later is
// ignored by the new group's tag anyway and ages out of the bounded mailbox).
void RingClusterSync::regroup(Ring& ring, std::vector<std::string> view, int64_t generation) {
  ring.view = std::move(view);
  ring.generation = generation;
  if (ring.group) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    bytes_retired_ += ring.group->stats().bytes_sent;
  }
  ring.group.reset();
  if (ring.view.size() > 1)
    ring.group = std::make_unique<ProcessGroup>(mailbox_, groupIdOf(ring.spec.id, generation),
                                                ring.view, node_.name, group_options_);
  if (generation == 0) return;
  const std::string id = ring.spec.id;
  auto stale = [&id, generation](const Message& m) {
    if (m.kind != MessageKind::kCollective) return false;
    const int64_t g = generationOfTag(m.tag, id);
    return g >= 0 && g < generation;
  };
  for (int i = 0; i < 4096 && mailbox_.receive(stale, std::chrono::milliseconds(0)); ++i) {
  }
}

uint64_t RingClusterSync::checksum(const Ring& ring) const {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < ring.tensors.size(); ++i) {
    const std::string& name = ring.spec.parameters[i];
    hash = fnv1a(hash, name.data(), name.size());
    torch::Tensor t = ring.tensors[i].detach().contiguous();
    const int dtype = int(t.scalar_type());
    hash = fnv1a(hash, &dtype, sizeof dtype);
    for (int64_t d : t.sizes()) hash = fnv1a(hash, &d, sizeof d);
    hash = fnv1a(hash, t.data_ptr(), size_t(t.numel()) * t.element_size());
  }
  return hash;
}

void RingClusterSync::buildBuckets(Ring& ring, torch::jit::Module& stage) {
  std::map<std::string, std::pair<torch::Tensor, bool>> state;
  for (const auto& p : stage.named_parameters(/*recurse=*/true)) state[p.name] = {p.value, true};
  for (const auto& b : stage.named_buffers(/*recurse=*/true)) state[b.name] = {b.value, false};
  ring.tensors.clear();
  ring.is_parameter.clear();
  ring.buckets.clear();
  std::map<std::pair<int, bool>, size_t> bucket_of;
  for (const auto& name : ring.spec.parameters) {
    auto it = state.find(name);
    if (it == state.end())
      CAIRN_THROW(BadInput, "node.json of ", node_.name, ": ring ", ring.spec.id, " lists ", name,
                  ", which the stage module (", node_.stage_file,
                  ") has neither as a parameter nor as a buffer");
    const torch::Tensor& t = it->second.first;
    CAIRN_ENFORCE(t.device().is_cpu(), "ring tensors must be on the CPU: ", name);
    const size_t index = ring.tensors.size();
    ring.tensors.push_back(t);
    ring.is_parameter.push_back(it->second.second);
    const auto key = std::make_pair(int(t.scalar_type()), it->second.second);
    auto [b, fresh] = bucket_of.emplace(key, ring.buckets.size());
    if (fresh) {
      Ring::Bucket bucket;
      bucket.dtype = t.scalar_type();
      bucket.parameters = it->second.second;
      ring.buckets.push_back(bucket);
    }
    ring.buckets[b->second].members.push_back(index);
    ring.buckets[b->second].numel += t.numel();
  }
  if (sync_.mode == SyncMode::kDiLoCo)
    for (auto& b : ring.buckets)
      if (b.parameters && at::isFloatingType(b.dtype)) b.previous = ring.flatten(b, false).clone();
}

// Identical start: hash of names, dtypes, shapes and bytes, all-gathered.
void RingClusterSync::checkIdenticalStart(Ring& ring) {
  torch::Tensor mine = torch::tensor({int64_t(checksum(ring))}, torch::kLong);
  const auto t0 = Clock::now();
  std::vector<torch::Tensor> all = ring.group->allGather(mine);
  countStats([&](RingClusterSyncStats& s) {
    s.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  });
  const auto& members = ring.spec.members;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].item<int64_t>() == all[0].item<int64_t>()) continue;
    CAIRN_THROW(BadInput, "ring ", ring.describe(), ": ", members[r].name, " (cluster ", r,
                ") starts from different weights than ", members[0].name,
                " (cluster 0): checksum ", uint64_t(all[r].item<int64_t>()), " vs ",
                uint64_t(all[0].item<int64_t>()),
                "; every cluster must start from the same stage weights (cut them from one "
                "model with one clusterize run). Refusing to train.");
  }
}

// DiLoCo outer state from a checkpoint (loadState): replaces the θ_prev taken from the stage.
void RingClusterSync::applyLoadedState(Ring& ring) {
  const std::string prefix = "sync." + ring.spec.id + ".";
  for (auto it = loaded_.begin(); it != loaded_.end();) {
    const std::string& name = it->first;
    if (name.compare(0, prefix.size(), prefix) != 0) {
      ++it;
      continue;
    }
    const std::string rest = name.substr(prefix.size());
    const auto dot = rest.find('.');
    const std::string what = rest.substr(0, dot);
    size_t index = ring.buckets.size();
    try {
      if (dot != std::string::npos) index = std::stoul(rest.substr(dot + 1));
    } catch (const std::exception&) {
    }
    if ((what != "previous" && what != "momentum") || index >= ring.buckets.size() ||
        !ring.buckets[index].previous.defined())
      CAIRN_THROW(BadInput, "checkpoint tensor ", name, ": ring ", ring.spec.id, " has ",
                  ring.buckets.size(), " buckets; expected sync.", ring.spec.id,
                  ".previous.<i> or .momentum.<i> of a floating parameter bucket (",
                  toString(sync_.mode), " mode)");
    Ring::Bucket& b = ring.buckets[index];
    const torch::Tensor& t = it->second;
    if (t.scalar_type() != b.dtype || t.dim() != 1 || t.numel() != b.numel)
      CAIRN_THROW(BadInput, "checkpoint tensor ", name, ": expected a 1-d ", dtypeName(b.dtype),
                  " tensor of ", b.numel, " elements, got ", dtypeName(t.scalar_type()), " ",
                  t.sizes());
    (what == "previous" ? b.previous : b.momentum) = t.clone();
    it = loaded_.erase(it);
  }
}

void RingClusterSync::start(torch::jit::Module& stage) {
  size_t tensors = 0;
  int64_t bytes = 0;
  left_ = false;
  for (auto& ring : rings_) {
    if (ring->spec.members.size() <= 1) continue;  // nothing is ever exchanged
    buildBuckets(*ring, stage);
    for (const auto& t : ring->tensors) {
      ++tensors;
      bytes += int64_t(t.numel() * t.element_size());
    }
    if (sync_.mode == SyncMode::kDiLoCo) applyLoadedState(*ring);
  }
  if (!loaded_.empty())
    CAIRN_THROW(BadInput, "checkpoint tensor ", loaded_.begin()->first,
                " names no ring that node ", node_.name, " shares with other clusters");
  const bool joined_any = joining_ && join();
  if (!joined_any) {
    std::vector<Ring*> shared;
    for (auto& ring : rings_) {
      if (ring->spec.members.size() <= 1) continue;
      std::vector<std::string> all;
      for (const auto& m : ring->spec.members) all.push_back(m.name);
      if (ring->generation != 0 || ring->view != all) regroup(*ring, all, 0);
      ring->transactions = 0;
      shared.push_back(ring.get());
    }
    forEachRing(shared, [this](Ring& ring) { checkIdenticalStart(ring); });
  }
  joining_ = false;
  started_ = true;
  if (activeRings() > 0) {
    std::ostringstream partners;
    for (const auto& ring : rings_) {
      if (!ring->group) continue;
      partners << " " << ring->spec.id << "[";
      bool first = true;
      for (const auto& m : ring->view)
        if (m != node_.name) {
          partners << (first ? "" : ",") << m;
          first = false;
        }
      partners << "]";
    }
    CAIRN_INFO("cross-cluster sync: ", toString(sync_.mode), ", local_steps ", local_steps_, ", ",
               activeRings(), " ring(s):", partners.str(), "; ", tensors, " tensors, ", bytes,
               joined_any ? " bytes; joined through a welcome"
                          : " bytes; identical initial weights verified");
  }
}

// Joining: ask every other member of every shared ring to admit this node; wait (up to the ring
// timeout in all) for one welcome per ring and copy what it carries into the stage.
bool RingClusterSync::join() {
  std::vector<Ring*> shared;
  for (auto& ring : rings_)
    if (ring->spec.members.size() > 1) shared.push_back(ring.get());
  if (shared.empty()) return false;
  for (Ring* ring : shared) {
    Message request;
    request.kind = MessageKind::kCollective;
    request.sender = node_.name;
    request.tag = controlTag(ring->spec.id);
    request.text = nlohmann::json{{"type", "join"}}.dump();
    for (const auto& m : ring->spec.members)
      if (m.name != node_.name) (void)mailbox_.send(m.name, request, kJoinRequestSendTimeout);
  }
  // A member that restarted quickly may still be in the live members' view: they need up to two
  // timeouts to drop it (ProcessGroup's keep-alive rule), then up to local_steps steps to reach a
  // sync boundary. Hence three timeouts, unless every other member is itself asking to join.
  const auto wait = 3 * timeout_;
  CAIRN_INFO("cross-cluster sync: asked the ring peers to admit ", node_.name, " (", shared.size(),
             " ring(s)); waiting up to ", wait.count(), " ms for a welcome");
  const auto deadline = Clock::now() + wait;
  size_t welcomed = 0;
  std::set<Ring*> done;
  auto everyoneJoining = [&] {
    for (Ring* ring : shared)
      for (const auto& m : ring->spec.members)
        if (m.name != node_.name && !ring->join_requests.count(m.name)) return false;
    return true;
  };
  while (done.size() < shared.size()) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (welcomed == 0 && everyoneJoining()) {
      CAIRN_INFO("cross-cluster sync: every other ring member is joining too (all restarting)");
      break;
    }
    auto m = mailbox_.receive(
        [&shared](const Message& x) {
          if (x.kind != MessageKind::kCollective) return false;
          for (Ring* ring : shared)
            if (x.tag == controlTag(ring->spec.id)) return true;
          return false;
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    if (!m) break;
    Ring* ring = nullptr;
    for (Ring* r : shared)
      if (m->tag == controlTag(r->spec.id)) ring = r;
    std::set<std::string> members;
    for (const auto& member : ring->spec.members) members.insert(member.name);
    if (m->text.find("\"join\"") != std::string::npos) {
      if (members.count(m->sender) && m->sender != node_.name) ring->join_requests.insert(m->sender);
      continue;
    }
    if (done.count(ring)) continue;
    {
      // A welcome from a non-member or one that does not fit this stage is dropped, not trusted.
      std::string problem;
      nlohmann::json j = nlohmann::json::parse(m->text, nullptr, /*allow_exceptions=*/false);
      std::vector<std::string> view;
      int64_t generation = -1;
      std::map<std::string, torch::Tensor> named;
      if (!members.count(m->sender) || m->sender == node_.name) {
        problem = "sender is not a ring member";
      } else if (!j.is_object() || !j.contains("type") || j["type"] != "welcome" ||
                 !j.contains("generation") ||
                 !j["generation"].is_number_integer() || !j.contains("view") ||
                 !j["view"].is_array()) {
        problem = "text must be a JSON welcome with integer \"generation\" and array \"view\"";
      } else {
        generation = j["generation"].get<int64_t>();
        for (const auto& v : j["view"]) {
          if (!v.is_string() || !members.count(v.get<std::string>())) {
            problem = "view names a non-member";
            break;
          }
          view.push_back(v.get<std::string>());
        }
        for (const char* key : {"step", "transactions", "checksum"})
          if (problem.empty() && (!j.contains(key) || !j[key].is_number_integer()))
            problem = std::string("\"") + key + "\" must be an integer";
        if (problem.empty() && (generation < 1 ||
                                std::find(view.begin(), view.end(), node_.name) == view.end() ||
                                std::find(view.begin(), view.end(), m->sender) == view.end()))
          problem = "view must hold this node and the sender, generation must be >= 1";
      }
      for (auto& t : m->tensors) named[t.name] = t.tensor;
      for (size_t i = 0; problem.empty() && i < ring->buckets.size(); ++i) {
        const auto& b = ring->buckets[i];
        auto check = [&](const std::string& key, bool required) {
          auto it = named.find(key);
          if (it == named.end()) {
            if (required) problem = "tensor " + key + " missing";
            return;
          }
          if (it->second.scalar_type() != b.dtype || it->second.dim() != 1 ||
              it->second.numel() != b.numel)
            problem = "tensor " + key + " should be 1-d " + dtypeName(b.dtype) + " of " +
                      std::to_string(b.numel) + " elements";
        };
        check("value." + std::to_string(i), b.numel > 0);
        if (b.previous.defined()) {
          check("previous." + std::to_string(i), true);
          check("momentum." + std::to_string(i), false);
        }
      }
      if (!problem.empty()) {
        CAIRN_WARN("ring ", ring->spec.id, ": dropped a welcome from ", m->sender, ": ", problem);
        continue;
      }
      for (size_t i = 0; i < ring->buckets.size(); ++i) {
        auto& b = ring->buckets[i];
        const std::string n = std::to_string(i);
        if (b.numel > 0) ring->unflatten(b, named.at("value." + n), false);
        if (b.previous.defined()) {
          b.previous = named.at("previous." + n).clone();
          auto mo = named.find("momentum." + n);
          b.momentum = mo == named.end() ? torch::Tensor() : mo->second.clone();
        }
      }
      const uint64_t sum = checksum(*ring);
      const uint64_t claimed = j["checksum"].get<uint64_t>();
      if (sum != claimed)
        CAIRN_WARN("ring ", ring->spec.id, ": welcome from ", m->sender, " claims checksum ",
                   claimed, " but its tensors hash to ", sum);
      std::vector<std::string> ordered;  // cluster order, whatever order the sender used
      for (const auto& member : ring->spec.members)
        if (std::find(view.begin(), view.end(), member.name) != view.end())
          ordered.push_back(member.name);
      regroup(*ring, ordered, generation);
      ring->transactions = j["transactions"].get<int64_t>();
      countStats([&](RingClusterSyncStats& s) {
        ++s.joined_rings;
        s.last_welcome_checksum = sum;
      });
      CAIRN_INFO("ring ", ring->spec.id, ": joined from ", m->sender, " at its step ",
                 j["step"].get<int64_t>(), ", generation ", generation, ", view ",
                 joined(ordered), "; fetched weights checksum ", sum);
      done.insert(ring);
      ++welcomed;
    }
  }
  if (welcomed == 0) {
    CAIRN_WARN("cross-cluster sync: no ring peer admitted ", node_.name,
               " (every cluster starting or resuming together?): ordinary start with the "
               "identical-weights check");
    return false;
  }
  for (Ring* ring : shared)
    if (!done.count(ring)) {
      CAIRN_WARN("ring ", ring->spec.id, ": no welcome within ", wait.count(),
                 " ms; this node trains without the ring (its syncs are no-ops)");
      regroup(*ring, {node_.name}, 0);
    }
  return true;
}

// Drains this ring's join requests from the mailbox. Requests from members of the view are kept
// (a member that restarted before it was found lost): they count once it has been dropped.
void RingClusterSync::collectJoinRequests(Ring& ring) {
  const std::string tag = controlTag(ring.spec.id);
  std::set<std::string> members;
  for (const auto& m : ring.spec.members) members.insert(m.name);
  auto match = [&tag](const Message& x) {
    return x.kind == MessageKind::kCollective && x.tag == tag &&
           x.text.find("\"join\"") != std::string::npos;
  };
  for (int i = 0; i < 1024; ++i) {
    auto m = mailbox_.receive(match, std::chrono::milliseconds(0));
    if (!m) break;
    if (!members.count(m->sender) || m->sender == node_.name) {
      CAIRN_WARN("ring ", ring.spec.id, ": ignored a join request from non-member \"", m->sender,
                 "\"");
      continue;
    }
    ring.join_requests.insert(m->sender);
  }
}

// After a committed sync: the lowest-ranked member of the view welcomes the joiners; every member
// moves to the next generation with them.
void RingClusterSync::admit(Ring& ring, const std::vector<std::string>& joiners) {
  std::vector<std::string> next;
  for (const auto& m : ring.spec.members)
    if (std::find(ring.view.begin(), ring.view.end(), m.name) != ring.view.end() ||
        std::find(joiners.begin(), joiners.end(), m.name) != joiners.end())
      next.push_back(m.name);
  const int64_t generation = ring.generation + 1;
  if (ring.view.front() == node_.name) {
    Message welcome;
    welcome.kind = MessageKind::kCollective;
    welcome.sender = node_.name;
    welcome.tag = controlTag(ring.spec.id);
    const uint64_t sum = checksum(ring);
    welcome.text = nlohmann::json{{"type", "welcome"},
                                  {"generation", generation},
                                  {"view", next},
                                  {"step", last_synced_step_},
                                  {"transactions", ring.transactions},
                                  {"checksum", sum}}
                       .dump();
    for (size_t i = 0; i < ring.buckets.size(); ++i) {
      const auto& b = ring.buckets[i];
      const std::string n = std::to_string(i);
      if (b.numel > 0) welcome.tensors.push_back({"value." + n, ring.flatten(b, false).contiguous()});
      if (b.previous.defined()) welcome.tensors.push_back({"previous." + n, b.previous.clone()});
      if (b.momentum.defined()) welcome.tensors.push_back({"momentum." + n, b.momentum.clone()});
    }
    for (const auto& j : joiners) {
      const SendStatus status = mailbox_.send(j, welcome, timeout_);
      if (status != SendStatus::kSent)
        CAIRN_WARN("ring ", ring.spec.id, ": welcome to ", j, " not sent (", toString(status),
                   "); it will be found lost at the next sync");
    }
    countStats([&](RingClusterSyncStats& s) { s.last_welcome_checksum = sum; });
    CAIRN_INFO("ring ", ring.spec.id, ": admitted ", joined(joiners), " at step ",
               last_synced_step_, ", generation ", generation, ", view ", joined(next),
               "; sent weights checksum ", sum);
  } else {
    CAIRN_INFO("ring ", ring.spec.id, ": ", joined(joiners), " admitted by ", ring.view.front(),
               ", generation ", generation, ", view ", joined(next));
  }
  for (const auto& j : joiners) ring.join_requests.erase(j);
  countStats([&](RingClusterSyncStats& s) { s.members_joined += int64_t(joiners.size()); });
  ring.alone_logged = false;
  regroup(ring, next, generation);
}

void RingClusterSync::dropMember(Ring& ring, const std::string& lost, bool left,
                                 const std::string& why) {
  std::vector<std::string> next;
  for (const auto& m : ring.view)
    if (m != lost) next.push_back(m);
  CAIRN_ENFORCE(next.size() < ring.view.size(), "ring ", ring.spec.id, ": lost member ", lost,
                " is not in the view ", joined(ring.view));
  countStats([&](RingClusterSyncStats& s) { ++(left ? s.members_left : s.members_lost); });
  CAIRN_WARN("ring ", ring.spec.id, ": dropped ", lost, left ? " (it left)" : " (lost)", "; ",
             why, "; continuing with ", joined(next), ", generation ", ring.generation + 1);
  regroup(ring, next, ring.generation + 1);
}

// The restore point of a sync: the ring's values (and gradients), θ_prev and momentum.
struct RingClusterSync::Snapshot {
  std::vector<torch::Tensor> values, grads, previous, momentum;
};

// After a loss: do the survivors keep the failed attempt's result or redo the sync? Each member
// contributes 2·S + (1 if its own work phase did not complete), max-reduced, where S counts the
// ring's committed transactions before this one. A member behind the maximum S (others committed
// this transaction and went on: everyone's work phase had completed, which the barrier proves)
// keeps its result; members at the maximum keep it only if all of them completed the work phase.
// Further losses during the agreement drop those members too and repeat it.
bool RingClusterSync::recover(Ring& ring, bool work_done) {
  for (;;) {
    if (!ring.group) return work_done;
    torch::Tensor vote = torch::tensor({2 * ring.transactions + (work_done ? 0 : 1)}, torch::kLong);
    try {
      ring.group->allReduce(vote, ReduceOp::kMax);
    } catch (const PeerLost& e) {
      const std::string lost = ring.group->lostPeer();
      if (lost.empty()) throw;
      dropMember(ring, lost, ring.group->lostByLeave(), e.what());
      continue;
    }
    const int64_t v = vote.item<int64_t>();
    const int64_t newest = v / 2;
    if (ring.transactions < newest) {
      if (!work_done)
        CAIRN_ERROR("ring ", ring.spec.id, ": members committed transaction ", ring.transactions,
                    " that this node did not complete; redoing it here");
      return work_done;
    }
    return v % 2 == 0;
  }
}

void RingClusterSync::transact(Ring& ring, bool gradients, bool admit_joiners,
                               const std::function<void()>& work) {
  Snapshot snap;
  for (const auto& b : ring.buckets) {
    snap.values.push_back(ring.flatten(b, false).clone());
    if (gradients) snap.grads.push_back(ring.flatten(b, true).clone());
    snap.previous.push_back(b.previous.defined() ? b.previous.clone() : torch::Tensor());
    snap.momentum.push_back(b.momentum.defined() ? b.momentum.clone() : torch::Tensor());
  }
  for (;;) {
    if (admit_joiners) collectJoinRequests(ring);
    if (!ring.group) {  // alone: nothing to exchange; welcome whoever asked
      if (!ring.alone_logged && ring.spec.members.size() > 1) {
        CAIRN_WARN("ring ", ring.spec.id, ": only this node (", node_.name,
                   ") is left; its syncs are no-ops until a member rejoins");
        ring.alone_logged = true;
      }
      ++ring.transactions;
      if (admit_joiners && !ring.join_requests.empty())
        admit(ring, {ring.join_requests.begin(), ring.join_requests.end()});
      return;
    }
    std::vector<std::string> joiners;
    bool work_done = false;
    try {
      if (admit_joiners) {
        // Agree on whom to admit: max over the members' "has asked" flags, per cluster.
        torch::Tensor asked = torch::zeros({int64_t(ring.spec.members.size())}, torch::kLong);
        for (size_t i = 0; i < ring.spec.members.size(); ++i) {
          const std::string& name = ring.spec.members[i].name;
          if (ring.join_requests.count(name) &&
              std::find(ring.view.begin(), ring.view.end(), name) == ring.view.end())
            asked[int64_t(i)] = 1;
        }
        ring.group->allReduce(asked, ReduceOp::kMax);
        for (size_t i = 0; i < ring.spec.members.size(); ++i)
          if (asked[int64_t(i)].item<int64_t>() != 0) joiners.push_back(ring.spec.members[i].name);
      }
      work();
      work_done = true;
      ring.group->barrier();  // the commit
    } catch (const PeerLost& e) {
      const std::string lost = ring.group->lostPeer();
      if (lost.empty()) throw;
      dropMember(ring, lost, ring.group->lostByLeave(), e.what());
      if (!recover(ring, work_done)) {
        for (size_t i = 0; i < ring.buckets.size(); ++i) {
          auto& b = ring.buckets[i];
          ring.unflatten(b, snap.values[i], false);
          if (gradients) ring.unflatten(b, snap.grads[i], true);
          b.previous = snap.previous[i].defined() ? snap.previous[i].clone() : torch::Tensor();
          b.momentum = snap.momentum[i].defined() ? snap.momentum[i].clone() : torch::Tensor();
        }
        countStats([&](RingClusterSyncStats& s) { ++s.redone_syncs; });
        continue;
      }
      CAIRN_INFO("ring ", ring.spec.id, ": the sync had completed everywhere before ", lost,
                 " was lost; its result stands");
    }
    ++ring.transactions;
    // Live members of the view took part: their earlier join requests are stale.
    for (const auto& m : ring.view) ring.join_requests.erase(m);
    if (!joiners.empty()) admit(ring, joiners);
    return;
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

void RingClusterSync::forEachRing(const std::vector<Ring*>& rings,
                                  const std::function<void(Ring&)>& body) {
  if (rings.size() <= 1 || !sync_.concurrent_rings) {
    for (Ring* ring : rings) body(*ring);
    return;
  }
  std::vector<std::exception_ptr> errors(rings.size());
  const at::ThreadLocalState torch_state;  // grad mode and the like, as on the calling thread
  auto run = [&](size_t i) {
    try {
      body(*rings[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  std::vector<size_t> inline_rings = {0};
  for (size_t i = 1; i < rings.size(); ++i) {
    try {
      threads.emplace_back([&run, &torch_state, i] {
        at::ThreadLocalStateGuard guard(torch_state);
        run(i);
      });
    } catch (const std::system_error& e) {  // no thread to be had: this ring runs here
      CAIRN_WARN("ring ", rings[i]->spec.id, ": no thread for it (", e.what(),
                 "); it runs after the others on this one");
      inline_rings.push_back(i);
    }
  }
  for (size_t i : inline_rings) run(i);
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void RingClusterSync::synchronize() {
  CAIRN_ENFORCE(started_, "RingClusterSync::synchronize before start()");
  if (left_) return;
  const auto t0 = Clock::now();
  std::vector<Ring*> shared;
  for (auto& ring : rings_)
    if (ring->spec.members.size() > 1) shared.push_back(ring.get());
  forEachRing(shared, [this](Ring& r) {
    transact(r, /*gradients=*/false, /*admit=*/true, [this, &r] {
      switch (sync_.mode) {
        case SyncMode::kAverage:
          reduceBuckets(r, true, true);
          break;
        case SyncMode::kDiLoCo:
          outerStep(r);
          break;
        case SyncMode::kGradients:
          reduceBuckets(r, false, true);  // parameters are kept equal by the gradients
          break;
      }
    });
  });
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.syncs;
  stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  stats_.bytes_sent = bytes_retired_;
  for (auto& ring : rings_)
    if (ring->group) stats_.bytes_sent += ring->group->stats().bytes_sent;
}

void RingClusterSync::beforeOptimizerStep(int64_t, torch::jit::Module&) {
  if (sync_.mode != SyncMode::kGradients || activeRings() == 0 || left_) return;
  const auto t0 = Clock::now();
  std::vector<Ring*> active;
  for (auto& ring : rings_)
    if (ring->group) active.push_back(ring.get());
  forEachRing(active, [this](Ring& r) {
    transact(r, /*gradients=*/true, /*admit=*/false, [this, &r] { averageGradients(r); });
  });
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.gradient_syncs;
  stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void RingClusterSync::afterOptimizerStep(int64_t step, torch::jit::Module&) {
  const int64_t done = step + 1;
  if (done % local_steps_ != 0) return;
  bool shared = false;
  for (const auto& ring : rings_) shared = shared || ring->spec.members.size() > 1;
  if (!shared || left_) return;
  last_synced_step_ = done;  // before the sync: a welcome sent during it names this step
  synchronize();
}

void RingClusterSync::leave() {
  if (left_) return;
  left_ = true;
  std::vector<std::string> told;
  for (auto& ring : rings_) {
    if (!ring->group) continue;
    ring->group->sendLeave(kLeaveSendTimeout);
    for (const auto& m : ring->view)
      if (m != node_.name) told.push_back(m);
    regroup(*ring, {node_.name}, ring->generation);
  }
  CAIRN_INFO("cross-cluster sync: ", node_.name, " leaves its rings; told ", joined(told));
}

void RingClusterSync::finish(int64_t steps, torch::jit::Module&) {
  bool shared = false;
  for (const auto& ring : rings_) shared = shared || ring->spec.members.size() > 1;
  if (!shared || left_) return;
  if (steps != last_synced_step_) {
    last_synced_step_ = steps;
    synchronize();
  }
  CAIRN_INFO("cross-cluster sync: ", stats_.syncs, " sync(s), ", stats_.gradient_syncs,
             " gradient all-reduce(s), ", stats_.seconds, " s, ", stats_.bytes_sent,
             " tensor bytes sent; members lost ", stats_.members_lost, ", left ",
             stats_.members_left, ", joined ", stats_.members_joined, ", syncs redone ",
             stats_.redone_syncs);
  // The run ended: members still training (a joiner that resumed from an older step) drop this
  // node at once instead of timing out on it.
  leave();
}

void RingClusterSync::saveState(std::vector<std::pair<std::string, torch::Tensor>>* tensors,
                                nlohmann::json* meta) const {
  nlohmann::json rings = nlohmann::json::object();
  for (const auto& ring : rings_) {
    for (size_t i = 0; i < ring->buckets.size(); ++i) {
      const auto& b = ring->buckets[i];
      const std::string n = std::to_string(i);
      if (b.previous.defined())
        tensors->emplace_back("sync." + ring->spec.id + ".previous." + n, b.previous.clone());
      if (b.momentum.defined())
        tensors->emplace_back("sync." + ring->spec.id + ".momentum." + n, b.momentum.clone());
    }
    rings[ring->spec.id] = {{"generation", ring->generation}, {"view", ring->view}};
  }
  (*meta)["last_synced_step"] = last_synced_step_;
  (*meta)["mode"] = toString(sync_.mode);
  (*meta)["rings"] = rings;
}

void RingClusterSync::loadState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                const nlohmann::json& meta) {
  loaded_.clear();
  for (const auto& [name, t] : tensors)
    if (name.rfind("sync.", 0) == 0) loaded_[name] = t;
  if (meta.is_object() && meta.contains("last_synced_step")) {
    const auto& s = meta["last_synced_step"];
    if (!s.is_number_integer() || s.get<int64_t>() < 0)
      CAIRN_THROW(BadInput, "checkpoint meta key sync.last_synced_step: expected a non-negative "
                            "integer, got ", s.dump());
    last_synced_step_ = s.get<int64_t>();
  }
}

}  // namespace cairn
