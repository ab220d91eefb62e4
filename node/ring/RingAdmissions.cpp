// RingClusterSync's membership changes between syncs (RingClusterSync.h): members added by a
// growth (addMembers, held for an admission step), and the gated admission of a cluster that
// resumes (gateAdmissions: the Root decides the step, the pipeline carries it, every ring admits
// the cluster there). Split from RingClusterSync.cpp along that seam; the same class.
#include "node/ring/RingClusterSync.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "core/Error.h"
#include "core/Log.h"
#include "node/ring/RingMembership.h"

namespace cairn {

std::vector<std::string> RingClusterSync::addMembers(const NodeSpec& updated,
                                                    bool at_admission_step) {
  const std::string& me = context_.node.name;
  if (updated.name != me)
    CAIRN_THROW(BadInput, "ring members for ", updated.name, " given to the rings of ", me);
  std::lock_guard<std::mutex> lock(added_mutex_);
  std::map<std::string, std::vector<PeerRef>> next = added_;
  std::vector<std::string> names;
  for (const RingSpec& spec : updated.rings) {
    const Ring* ring = nullptr;
    for (const auto& r : rings_)
      if (r->spec.id == spec.id) ring = r.get();
    if (!ring)
      CAIRN_THROW(BadInput, "ring members for ", me, ": node ", me, " has no ring ", spec.id);
    auto known = next.find(spec.id);
    const std::vector<PeerRef>& now = known != next.end() ? known->second : ring->spec.members;
    if (spec.members.size() < now.size())
      CAIRN_THROW(BadInput, "ring members for ", me, ": ring ", spec.id, " lists ",
                  spec.members.size(), " members, fewer than its ", now.size(),
                  "; members are only ever appended");
    for (size_t i = 0; i < now.size(); ++i)
      if (spec.members[i].name != now[i].name)
        CAIRN_THROW(BadInput, "ring members for ", me, ": ring ", spec.id, " member ", i, " is \"",
                    spec.members[i].name, "\", not \"", now[i].name,
                    "\"; members are only ever appended");
    std::set<std::string> seen;
    for (const auto& m : spec.members)
      if (m.name.empty() || !seen.insert(m.name).second)
        CAIRN_THROW(BadInput, "ring members for ", me, ": ring ", spec.id,
                    " names member \"", m.name, "\" twice or with no name");
    for (size_t i = now.size(); i < spec.members.size(); ++i) names.push_back(spec.members[i].name);
    if (spec.members.size() > now.size()) next[spec.id] = spec.members;
  }
  if (!at_admission_step)
    // A growth abandoned before its admission: the update lists the rings without the members
    // held for it, which are dropped (never admitted).
    for (const RingSpec& spec : updated.rings) {
      auto held = held_.find(spec.id);
      if (held != held_.end() && spec.members.size() < held->second.size()) {
        CAIRN_INFO("ring ", spec.id, ": the members held for a new cluster are dropped (the growth was abandoned)");
        held_.erase(held);
      }
    }
  if (at_admission_step) {
    for (auto& [id, members] : next) {
      auto known = added_.find(id);
      if (known == added_.end() || known->second.size() != members.size()) held_[id] = members;
    }
    return names;
  }
  added_ = std::move(next);
  return names;
}

void RingClusterSync::applyAddedMembers(torch::jit::Module& stage) {
  std::map<std::string, std::vector<PeerRef>> added;
  {
    std::lock_guard<std::mutex> lock(added_mutex_);
    added.swap(added_);
  }
  for (auto& [id, members] : added) {
    for (auto& ring : rings_) {
      if (ring->spec.id != id || members.size() <= ring->spec.members.size()) continue;
      const bool was_alone = ring->spec.members.size() <= 1;
      std::vector<std::string> names;
      for (size_t i = ring->spec.members.size(); i < members.size(); ++i) names.push_back(members[i].name);
      ring->spec.members = members;
      if (was_alone) {
        // Its tensors were never gathered (nothing was exchanged): gather them now.
        if (overlap_) overlap_->forget(ring.get());
        ring->build(ring->spec.parameters, stage, context_.node.name, ring->spec.id,
                    context_.node.stage_file, context_.sync.mode == SyncMode::kDiLoCo);
        ring->view = {context_.node.name};
        ring->alone_logged = true;  // alone because the others have not joined yet, not lost
      }
      for (const auto& n : names)
        if (ring->strangers.erase(n)) ring->join_requests.insert(n);
      CAIRN_INFO("ring ", id, ": members added ", joinedNames(names),
                 "; they are welcomed at a sync once they ask to join");
    }
  }
}

void RingClusterSync::expectAddedMembers() {
  std::lock_guard<std::mutex> lock(added_mutex_);
  for (auto& ring : rings_) {
    ring->expected_members.clear();
    for (const auto* pending : {&held_, &added_}) {
      auto it = pending->find(ring->spec.id);
      if (it != pending->end() && it->second.size() > ring->spec.members.size() &&
          it->second.size() > ring->expected_members.size())
        ring->expected_members = it->second;
    }
  }
}

void RingClusterSync::admitJoinersAt(int64_t steps_done) {
  if (context_.gated) {
    admitClustersAt({steps_done, {}, /*growth=*/true});
    return;
  }
  if (admit_at_.insert(steps_done).second)
    CAIRN_INFO("cross-cluster sync: the new cluster's members are taken into the rings at the sync "
               "after step ", steps_done);
}

void RingClusterSync::gateAdmissions(bool decides) {
  context_.gated = true;  // read by start() (no welcome desk) and the syncs
  decides_ = decides;
}

void RingClusterSync::admitClustersAt(const ClusterAdmission& admission) {
  if (!context_.gated || (admission.clusters.empty() && !admission.growth)) return;
  if (admission.steps_done <= last_boundary_) {
    CAIRN_WARN("cross-cluster sync: an admission at the sync after step ", admission.steps_done,
               " came after this node passed it (at step ", last_boundary_, "); ignored");
    return;
  }
  PendingAdmission& at = admit_clusters_at_[admission.steps_done];
  std::vector<std::string> added;
  for (const int64_t c : admission.clusters)
    if (at.clusters.insert(c).second) added.push_back(std::to_string(c));
  if (!added.empty())
    CAIRN_INFO("cross-cluster sync: ring members of cluster(s) ", joinedNames(added),
               " are taken into the rings at the sync after step ", admission.steps_done);
  if (admission.growth && !at.growth) {
    at.growth = true;
    CAIRN_INFO("cross-cluster sync: the new cluster's members are taken into the rings at the sync "
               "after step ", admission.steps_done);
  }
}

std::optional<ClusterAdmission> RingClusterSync::pendingAdmission() const {
  if (admit_clusters_at_.empty()) return std::nullopt;
  const auto& [steps_done, pending] = *admit_clusters_at_.begin();
  return ClusterAdmission{steps_done, {pending.clusters.begin(), pending.clusters.end()},
                          pending.growth};
}

void RingClusterSync::decideAdmission(int64_t steps_done) {
  std::set<int64_t> asked;
  for (Ring* ring : sharedRings()) {
    asked.insert(ring->asked_clusters.begin(), ring->asked_clusters.end());
    ring->asked_clusters.clear();
  }
  // Every Root gathered the same agreement at this sync (the ring of the model's first
  // parameters holds every Root), so every Root decides the same admission here.
  if (!decides_ || asked.empty()) return;
  // The next sync boundary on the local_steps grid (a sync off it, a growth admission, may be
  // where the request was seen).
  admitClustersAt({(steps_done / local_steps_ + 1) * local_steps_, {asked.begin(), asked.end()}});
}

void RingClusterSync::admitAskersBetweenSyncs(int64_t steps_done) {
  // Requests wait in the mailbox between syncs (the welcome desk is off while gated); taking them
  // here costs a look at the mailbox's buffer and at most one read of the transport a step.
  // Clusters already pending at some boundary, or admitted and not yet in every view.
  std::set<int64_t> taken = admitted_clusters_;
  for (const auto& [at, pending] : admit_clusters_at_)
    taken.insert(pending.clusters.begin(), pending.clusters.end());
  std::set<int64_t> asked;
  std::vector<std::string> askers;
  for (Ring* ring : sharedRings()) {
    collectJoinRequests(context_, *ring);
    const std::vector<PeerRef>& m = ring->spec.members;
    for (size_t i = 0; i < m.size(); ++i)
      if (ring->join_requests.count(m[i].name) && !taken.count(int64_t(i)) &&
          std::find(ring->view.begin(), ring->view.end(), m[i].name) == ring->view.end() &&
          asked.insert(int64_t(i)).second)
        askers.push_back(m[i].name);
  }
  if (asked.empty()) return;
  CAIRN_INFO("cross-cluster sync: ", joinedNames(askers), " asked to join between syncs (after step ",
             steps_done, ")");
  admitClustersAt({(steps_done / local_steps_ + 1) * local_steps_, {asked.begin(), asked.end()}});
}

void RingClusterSync::shareHeldMembers() {
  std::lock_guard<std::mutex> lock(added_mutex_);
  for (auto& ring : rings_) {
    auto it = held_.find(ring->spec.id);
    ring->held_members = it != held_.end() ? it->second : std::vector<PeerRef>{};
  }
}

void RingClusterSync::dropHeldTakenIn() {
  std::lock_guard<std::mutex> lock(added_mutex_);
  for (auto& ring : rings_) {
    auto it = held_.find(ring->spec.id);
    if (it != held_.end() && ring->spec.members.size() >= it->second.size()) {
      held_.erase(it);
      held_taken_in_ = true;  // admitHeld at this node's own admission step has nothing to wait for
    }
    ring->held_members.clear();
  }
}

void RingClusterSync::admitHeld(torch::jit::Module& stage, int64_t steps_done) {
  {
    std::lock_guard<std::mutex> lock(added_mutex_);
    if (held_.empty() && held_taken_in_) {
      held_taken_in_ = false;
      CAIRN_INFO("cross-cluster sync: the new cluster's members were taken into the rings at an "
                 "earlier sync, when another member admitted them");
      return;
    }
    held_taken_in_ = false;
  }
  const auto deadline = std::chrono::steady_clock::now() + context_.timeout;
  auto take_held = [this] {
    std::lock_guard<std::mutex> lock(added_mutex_);
    const bool any = !held_.empty();
    for (auto& [id, members] : held_) added_[id] = members;
    held_.clear();
    return any;
  };
  // A node whose node.json already lists members outside its views (it started, or restarted from
  // a checkpoint, after the coordinator's update with the new cluster: the 24-volunteer soak's
  // replaced Root waited a ring timeout here for an update that had come before) has no update
  // to wait for; a member lost meanwhile is waited for below only as long as any joiner.
  bool known = false;
  for (Ring* ring : sharedRings())
    for (const PeerRef& m : ring->spec.members)
      known = known || std::find(ring->view.begin(), ring->view.end(), m.name) == ring->view.end();
  std::optional<std::chrono::steady_clock::time_point> stop_seen;
  for (bool waited = false; !take_held() && !known; waited = true) {
    checkStop(context_, &stop_seen, "for the coordinator's update with the new ring members");
    if (std::chrono::steady_clock::now() >= deadline) {
      CAIRN_WARN("cross-cluster sync: no ring members were added for step ", steps_done,
                 " within ", context_.timeout.count(), " ms; training on without them");
      return;
    }
    if (!waited)
      CAIRN_INFO("cross-cluster sync: waiting for the coordinator's update with the new members");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  applyAddedMembers(stage);
  awaitJoinRequests(context_, sharedRings(), deadline);
}

}  // namespace cairn
