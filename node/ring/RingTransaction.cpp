#include "node/ring/RingTransaction.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "node/ring/RingMembership.h"
#include "node/ring/RingWelcomeDesk.h"

namespace cairn {
namespace {

// The restore point of a sync: the ring's values (and gradients), θ_prev and momentum.
struct Snapshot {
  std::vector<torch::Tensor> values, grads, previous, momentum;
};

Snapshot takeSnapshot(const Ring& ring, bool gradients) {
  Snapshot snap;
  for (const auto& b : ring.buckets) {
    snap.values.push_back(ring.flatten(b, false).clone());
    if (gradients) snap.grads.push_back(ring.flatten(b, true).clone());
    snap.previous.push_back(b.previous.defined() ? b.previous.clone() : torch::Tensor());
    snap.momentum.push_back(b.momentum.defined() ? b.momentum.clone() : torch::Tensor());
  }
  return snap;
}

void restoreSnapshot(Ring& ring, const Snapshot& snap, bool gradients) {
  for (size_t i = 0; i < ring.buckets.size(); ++i) {
    auto& b = ring.buckets[i];
    ring.unflatten(b, snap.values[i], false);
    if (gradients) ring.unflatten(b, snap.grads[i], true);
    b.previous = snap.previous[i].defined() ? snap.previous[i].clone() : torch::Tensor();
    b.momentum = snap.momentum[i].defined() ? snap.momentum[i].clone() : torch::Tensor();
  }
}

// The joiners this sync admits: all of them, unless admissions are gated (RingState.h
// RingContext::gated); then those of the clusters in `admit` (at a sync, what the members agreed
// on; alone, this node's own RingContext::admitting), the others noted as asking
// (Ring::asked_clusters) for the Root's decision (RingClusterSync::gateAdmissions).
std::vector<std::string> admissible(const RingContext& context, Ring& ring,
                                    const std::vector<std::string>& joiners,
                                    const std::set<int64_t>& admit) {
  if (!context.gated) return joiners;
  std::vector<std::string> now;
  for (const auto& j : joiners) {
    const auto& m = ring.spec.members;
    const auto at = std::find_if(m.begin(), m.end(), [&j](const PeerRef& p) { return p.name == j; });
    const int64_t cluster = int64_t(at - m.begin());
    if (admit.count(cluster))
      now.push_back(j);
    else
      ring.asked_clusters.insert(cluster);
  }
  return now;
}

// This node's own admission set this sync (gated): the clusters of RingContext::admitting, or
// every member's with admit_all.
std::set<int64_t> ownAdmissions(const RingContext& context, const Ring& ring) {
  if (!context.admit_all) return context.admitting;
  std::set<int64_t> all;
  for (size_t i = 0; i < ring.spec.members.size(); ++i) all.insert(int64_t(i));
  return all;
}

// A ring left with only this node: nothing to exchange; its transaction counts, and with
// `admit_joiners` its deal tally is its own offer and whoever asked is welcomed.
void transactAlone(RingContext& context, Ring& ring, bool admit_joiners) {
  if (!ring.alone_logged && ring.spec.members.size() > 1) {
    CAIRN_WARN("ring ", ring.spec.id, ": only this node (", context.node.name,
               ") is left; its syncs are no-ops until a member rejoins");
    ring.alone_logged = true;
  }
  ++ring.transactions;
  if (admit_joiners) noteResult(context, ring);  // nothing changed: its tensors are its result
  if (admit_joiners) {
    const uint64_t offer = context.deal_offer;
    ring.deal_tally = {true, offer, offer, offer != 0 && !context.deal_can_take,
                       context.last_synced_step, offer != 0 && context.deal_taken};
  }
  if (admit_joiners && !ring.join_requests.empty()) {
    const auto now = admissible(context, ring, {ring.join_requests.begin(), ring.join_requests.end()},
                                ownAdmissions(context, ring));
    if (!now.empty()) admit(context, ring, now);
  }
  if (admit_joiners) keepWelcomeSnapshot(context, ring);
}

// What the members agree on at an admitting sync: who asked to join, and (gated admissions) the
// clusters whose joiners this sync takes in.
struct JoinAgreement {
  std::vector<std::string> joiners;
  std::set<int64_t> admit;
};

// Agree on whom to admit: max over the members' "has asked" flags, per cluster, then over their
// "admit now" flags (gated: the clusters of this admission step; a member that has one makes the
// whole ring admit them, so the view stays one). The same max-all-reduce tallies the deal
// proposals (ClusterSync::proposeDeal): after the flags, the largest offer (abstaining: 0), minus
// the smallest (abstaining: kAbstain), whether a proposer's own checks refused its offer, the most
// steps a member had done (DealAgreement::leading_steps_done), and whether a proposer had already
// taken its offer (DealAgreement::taken_before).
JoinAgreement agreeOnJoiners(RingContext& context, Ring& ring) {
  constexpr int64_t kAbstain = std::numeric_limits<int64_t>::min();
  // The members may list different numbers of ring members: a growth appends members, and a
  // member that restarted read them from its node.json while the live ones hold them until the
  // admission step. The flags are sized by the largest list (so every member reduces tensors of
  // one size) and only the members every list holds can be admitted (the shortest), or every list
  // with the members its node holds for an admission (Ring::held_members: see below).
  const std::vector<PeerRef>& held = ring.held_members.size() > ring.spec.members.size()
                                         ? ring.held_members
                                         : ring.spec.members;
  const int64_t own_size = int64_t(ring.spec.members.size()), held_size = int64_t(held.size());
  torch::Tensor sizes = torch::tensor({held_size, -own_size, -held_size}, torch::kLong);
  ring.group->allReduce(sizes, ReduceOp::kMax);
  // width: the longest list or held list (every member's flags have this size); known: the
  // shortest list; reach: the shortest list with its held members.
  const int64_t width = sizes[0].item<int64_t>(), known = -sizes[1].item<int64_t>(),
                reach = -sizes[2].item<int64_t>();
  torch::Tensor asked = torch::zeros({2 * width + 5}, torch::kLong);
  const std::set<int64_t> own = ownAdmissions(context, ring);
  for (size_t i = 0; i < held.size(); ++i) {
    const std::string& name = held[i].name;
    const bool member = i < ring.spec.members.size();
    if ((ring.join_requests.count(name) || (!member && ring.strangers.count(name))) &&
        std::find(ring.view.begin(), ring.view.end(), name) == ring.view.end())
      asked[int64_t(i)] = 1;
    if (own.count(int64_t(i)) || (!member && context.admit_all)) asked[width + int64_t(i)] = 1;
  }
  const int64_t offer = int64_t(context.deal_offer);  // below 2^62 (DealChange.h)
  asked[2 * width] = offer;
  asked[2 * width + 1] = offer != 0 ? -offer : kAbstain;
  asked[2 * width + 2] = offer != 0 && !context.deal_can_take ? 1 : 0;
  asked[2 * width + 3] = context.last_synced_step;
  asked[2 * width + 4] = offer != 0 && context.deal_taken ? 1 : 0;
  ring.group->allReduce(asked, ReduceOp::kMax);
  // Members that some member admits at this sync (its admission step: a growth's) and that every
  // member lists or holds: a node that only holds them takes them in as members first, so the
  // ring admits them at one sync whether or not this node armed the admission itself.
  int64_t take_to = known;
  for (int64_t i = known; i < reach; ++i)
    if (asked[i].item<int64_t>() != 0 && asked[width + i].item<int64_t>() != 0) take_to = i + 1;
  if (take_to > own_size) {
    std::vector<std::string> names;
    for (int64_t i = own_size; i < take_to; ++i) {
      names.push_back(held[size_t(i)].name);
      if (ring.strangers.erase(names.back())) ring.join_requests.insert(names.back());
    }
    ring.spec.members.assign(ring.held_members.begin(), ring.held_members.begin() + take_to);
    CAIRN_INFO("ring ", ring.spec.id, ": members ", joinedNames(names), " held for a new "
               "cluster's admission are taken in: another member admits them at this sync");
  }
  JoinAgreement agreed;
  for (int64_t i = 0; i < std::max(known, take_to); ++i) {
    if (asked[i].item<int64_t>() != 0) agreed.joiners.push_back(ring.spec.members[size_t(i)].name);
    if (asked[width + i].item<int64_t>() != 0) agreed.admit.insert(i);
  }
  const int64_t largest = asked[2 * width].item<int64_t>(), smallest = asked[2 * width + 1].item<int64_t>();
  ring.deal_tally = {true, uint64_t(largest), smallest == kAbstain ? 0 : uint64_t(-smallest),
                     asked[2 * width + 2].item<int64_t>() != 0, asked[2 * width + 3].item<int64_t>(),
                     asked[2 * width + 4].item<int64_t>() != 0};
  return agreed;
}

}  // namespace

// After a loss: do the survivors keep the failed attempt's result or redo the sync? Each member
// contributes 2·S + (1 if its own work phase did not complete), max-reduced, where S counts the
// ring's committed transactions before this one. A member behind the maximum S (others committed
// this transaction and went on: everyone's work phase had completed, which the barrier proves)
// keeps its result; members at the maximum keep it only if all of them completed the work phase.
// Further losses during the agreement drop those members too and repeat it.
bool recover(RingContext& context, Ring& ring, bool work_done) {
  for (;;) {
    if (!ring.group) return work_done;
    torch::Tensor vote = torch::tensor({2 * ring.transactions + (work_done ? 0 : 1)}, torch::kLong);
    try {
      ring.group->allReduce(vote, ReduceOp::kMax);
    } catch (const PeerLost& e) {
      dropLost(context, ring, e);
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

// Drops the member a PeerLost of the ring's group names. Called from the handler of `e`: one that
// names nobody is rethrown as it is.
void dropLost(RingContext& context, Ring& ring, const PeerLost& e) {
  // The group's PeerLost says whom it blames (every survivor blames the same member).
  if (!e.loss() || e.loss()->peer.empty()) throw;
  dropMember(context, ring, e.loss()->peer, e.loss()->cause == LossCause::kLeft, e.what());
}

bool settleLoss(RingContext& context, Ring& ring, const PeerLost& e, bool work_done,
                const std::function<void()>& restore) {
  dropLost(context, ring, e);
  if (!recover(context, ring, work_done)) {
    restore();
    context.countStats([](RingClusterSyncStats& s) { ++s.redone_syncs; });
    return false;
  }
  CAIRN_INFO("ring ", ring.spec.id, ": the sync had completed everywhere before ", e.loss()->peer,
             " was lost; its result stands");
  return true;
}

void commitTransaction(Ring& ring) {
  ++ring.transactions;
  // Live members of the view took part: their earlier join requests are stale.
  for (const auto& m : ring.view) ring.join_requests.erase(m);
}

void transact(RingContext& context, Ring& ring, bool gradients, bool admit_joiners,
              const std::function<void()>& work) {
  const Snapshot snap = takeSnapshot(ring, gradients);
  for (;;) {
    if (admit_joiners) collectJoinRequests(context, ring);
    if (!ring.group) {  // alone: nothing to exchange; welcome whoever asked
      transactAlone(context, ring, admit_joiners);
      return;
    }
    JoinAgreement agreed;
    bool work_done = false;
    try {
      if (admit_joiners) agreed = agreeOnJoiners(context, ring);
      work();
      work_done = true;
      ring.group->barrier();  // the commit
    } catch (const PeerLost& e) {
      if (!settleLoss(context, ring, e, work_done,
                      [&] { restoreSnapshot(ring, snap, gradients); }))
        continue;
    }
    commitTransaction(ring);
    if (!gradients) noteResult(context, ring);  // before a welcome carries it to the joiners
    const std::vector<std::string> joiners =
        agreed.joiners.empty() ? agreed.joiners : admissible(context, ring, agreed.joiners, agreed.admit);
    if (!joiners.empty()) admit(context, ring, joiners);
    // The state a welcome between syncs carries (RingWelcomeDesk.h): this committed sync's.
    if (admit_joiners) keepWelcomeSnapshot(context, ring);
    return;
  }
}

}  // namespace cairn
