#include "coordinator/RelayedPlacement.h"

#include <algorithm>
#include <set>

#include "coordinator/DialOutPlacement.h"

namespace cairn::coordinator {
namespace {

constexpr double kExhaustiveLimit = 20000;
constexpr double kFp32Bytes = 4;

std::pair<std::string, std::string> linkOf(const std::string& a, const std::string& b) {
  return a < b ? std::make_pair(a, b) : std::make_pair(b, a);
}

// The choice of which slots hold the dial-out-only volunteers, and what its relayed links carry.
struct SlotChoice {
  std::vector<size_t> slots_of;  // per slot: its index
  const std::vector<std::vector<std::pair<size_t, double>>>& adjacent;  // slot → (slot, bytes)
  std::vector<bool> dial_out;    // per slot: holds a dial-out-only volunteer

  double cost() const {
    double total = 0;
    for (size_t a = 0; a < adjacent.size(); ++a)
      for (const auto& [b, bytes] : adjacent[a])
        if (a < b && dial_out[a] && dial_out[b]) total += bytes;
    return total;
  }
  // What moving the dial-out-only volunteer of `from` to `to` (a reachable one's) changes.
  double swapDelta(size_t from, size_t to) const {
    double delta = 0;
    for (const auto& [b, bytes] : adjacent[from])
      if (b != to && dial_out[b]) delta -= bytes;
    for (const auto& [b, bytes] : adjacent[to])
      if (b != from && dial_out[b]) delta += bytes;
    return delta;
  }
};

// Every way to choose, per class, which of its slots hold its dial-out-only volunteers: the best.
void enumerate(SlotChoice& choice, const std::vector<std::pair<std::vector<size_t>, size_t>>& classes,
               size_t at, double* best, std::vector<bool>* best_dial_out) {
  if (at == classes.size()) {
    const double c = choice.cost();
    if (c < *best) {
      *best = c;
      *best_dial_out = choice.dial_out;
    }
    return;
  }
  const auto& [slots, count] = classes[at];
  std::vector<bool> mask(slots.size(), false);
  std::fill(mask.begin(), mask.begin() + long(count), true);
  do {
    for (size_t i = 0; i < slots.size(); ++i) choice.dial_out[slots[i]] = mask[i];
    enumerate(choice, classes, at + 1, best, best_dial_out);
  } while (std::prev_permutation(mask.begin(), mask.end()));
}

double combinations(size_t n, size_t k) {
  double c = 1;
  for (size_t i = 0; i < k; ++i) c = c * double(n - i) / double(i + 1);
  return c;
}

}  // namespace

LinkBytes linkBytesPerStep(const clusterize::PartitionPlan& plan, const JobSpec& job) {
  LinkBytes out;
  const int microbatches = std::max(1, plan.microbatches);
  for (const clusterize::PlannedCluster& cluster : plan.clusters) {
    double from_upstream = 0;  // the wire bytes of the cut above this stage (its gradients' size)
    for (size_t s = 0; s + 1 < cluster.stages.size(); ++s) {
      const double down = std::max(0.0, cluster.stages[s].sent_bytes - from_upstream);
      out[linkOf(cluster.stages[s].node, cluster.stages[s + 1].node)] += 2 * down * microbatches;
      from_upstream = down;
    }
  }
  const nlohmann::json& t = job.training;
  const std::string sync = t.is_object() ? t.value("sync", std::string("average")) : "average";
  const double every = sync == "gradients" ? 1.0
                                           : std::max<int64_t>(1, t.is_object() ? t.value("local_steps", int64_t(1)) : 1);
  // A stage's parameter bytes, shared among its rings by their parameters' count (the plan keeps
  // no per-parameter size: an estimate).
  std::map<std::string, const clusterize::PlannedStage*> stage_of;
  for (const clusterize::PlannedCluster& cluster : plan.clusters)
    for (const clusterize::PlannedStage& stage : cluster.stages) stage_of[stage.node] = &stage;
  for (const clusterize::RingGroup& ring : plan.rings) {
    if (ring.holders.size() < 2 || !stage_of.count(ring.holders[0])) continue;
    const clusterize::PlannedStage& stage = *stage_of[ring.holders[0]];
    const double share = stage.parameters.empty() ? 1.0
                                                  : double(ring.parameters.size()) / double(stage.parameters.size());
    const double ring_bytes = double(stage.parameter_count) * kFp32Bytes * share;
    const double n = double(ring.holders.size());
    for (size_t i = 0; i < ring.holders.size(); ++i)
      for (size_t j = i + 1; j < ring.holders.size(); ++j)
        out[linkOf(ring.holders[i], ring.holders[j])] += 2 * ring_bytes / n / every;
  }
  return out;
}

std::vector<size_t> cheapestRelayedSlots(const LinkBytes& bytes, const std::vector<Member>& volunteers) {
  std::map<std::string, size_t> slot_of;
  for (size_t i = 0; i < volunteers.size(); ++i) slot_of[volunteers[i].name] = i;
  std::vector<std::vector<std::pair<size_t, double>>> adjacent(volunteers.size());
  for (const auto& [link, b] : bytes) {
    if (!slot_of.count(link.first) || !slot_of.count(link.second)) continue;
    adjacent[slot_of[link.first]].emplace_back(slot_of[link.second], b);
    adjacent[slot_of[link.second]].emplace_back(slot_of[link.first], b);
  }
  SlotChoice choice{{}, adjacent, std::vector<bool>(volunteers.size(), false)};
  std::map<std::string, std::pair<std::vector<size_t>, size_t>> by_class;  // slots, dial-out count
  for (size_t i = 0; i < volunteers.size(); ++i) {
    auto& [slots, count] = by_class[swapClassOf(volunteers[i])];
    slots.push_back(i);
    count += volunteers[i].dial_out_only ? 1 : 0;
    choice.dial_out[i] = volunteers[i].dial_out_only;  // the planner's own placement
  }
  const double planned = choice.cost();
  std::vector<std::pair<std::vector<size_t>, size_t>> classes;
  double ways = 1;
  for (const auto& [cls, entry] : by_class) {
    classes.push_back(entry);
    ways *= combinations(entry.first.size(), entry.second);
  }
  std::vector<bool> best_dial_out = choice.dial_out;
  double best = planned;
  if (ways <= kExhaustiveLimit) {
    enumerate(choice, classes, 0, &best, &best_dial_out);
  } else {
    for (bool improved = true; improved;) {  // one dial-out-only and one reachable swap places
      improved = false;
      for (const auto& [slots, count] : classes)
        for (size_t from : slots)
          for (size_t to : slots)
            if (choice.dial_out[from] && !choice.dial_out[to] && choice.swapDelta(from, to) < -1e-9) {
              choice.dial_out[from] = false;
              choice.dial_out[to] = true;
              improved = true;
            }
    }
    best = choice.cost();
    best_dial_out = choice.dial_out;
  }
  std::vector<size_t> taken_by(volunteers.size());
  for (size_t i = 0; i < volunteers.size(); ++i) taken_by[i] = i;
  if (best >= planned - 1e-9) return taken_by;
  for (const auto& [slots, count] : classes) {  // per class: its volunteers into its chosen slots
    std::vector<size_t> dial_out, reachable;
    for (size_t v : slots) (volunteers[v].dial_out_only ? dial_out : reachable).push_back(v);
    size_t d = 0, r = 0;
    for (size_t slot : slots) taken_by[slot] = best_dial_out[slot] ? dial_out[d++] : reachable[r++];
  }
  return taken_by;
}

double relayedBytesPerStep(const LinkBytes& bytes, const std::vector<std::string>& dial_out_only) {
  const std::set<std::string> behind(dial_out_only.begin(), dial_out_only.end());
  double total = 0;
  for (const auto& [link, b] : bytes)
    if (behind.count(link.first) && behind.count(link.second)) total += b;
  return total;
}

}  // namespace cairn::coordinator
