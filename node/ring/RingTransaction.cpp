#include "node/ring/RingTransaction.h"

#include <algorithm>
#include <limits>
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
    ring.deal_tally = {true, offer, offer, offer != 0 && !context.deal_can_take};
  }
  if (admit_joiners && !ring.join_requests.empty())
    admit(context, ring, {ring.join_requests.begin(), ring.join_requests.end()});
  if (admit_joiners) keepWelcomeSnapshot(context, ring);
}

// Agree on whom to admit: max over the members' "has asked" flags, per cluster; returns the
// joiners. The same max-all-reduce tallies the deal proposals (ClusterSync::proposeDeal): after
// the flags, the largest offer (abstaining: 0), minus the smallest (abstaining: kAbstain), and
// whether a proposer's own checks refused its offer.
std::vector<std::string> agreeOnJoiners(RingContext& context, Ring& ring) {
  constexpr int64_t kAbstain = std::numeric_limits<int64_t>::min();
  const int64_t n = int64_t(ring.spec.members.size());
  torch::Tensor asked = torch::zeros({n + 3}, torch::kLong);
  for (size_t i = 0; i < ring.spec.members.size(); ++i) {
    const std::string& name = ring.spec.members[i].name;
    if (ring.join_requests.count(name) &&
        std::find(ring.view.begin(), ring.view.end(), name) == ring.view.end())
      asked[int64_t(i)] = 1;
  }
  const int64_t offer = int64_t(context.deal_offer);  // below 2^62 (DealChange.h)
  asked[n] = offer;
  asked[n + 1] = offer != 0 ? -offer : kAbstain;
  asked[n + 2] = offer != 0 && !context.deal_can_take ? 1 : 0;
  ring.group->allReduce(asked, ReduceOp::kMax);
  std::vector<std::string> joiners;
  for (size_t i = 0; i < ring.spec.members.size(); ++i)
    if (asked[int64_t(i)].item<int64_t>() != 0) joiners.push_back(ring.spec.members[i].name);
  const int64_t largest = asked[n].item<int64_t>(), smallest = asked[n + 1].item<int64_t>();
  ring.deal_tally = {true, uint64_t(largest), smallest == kAbstain ? 0 : uint64_t(-smallest),
                     asked[n + 2].item<int64_t>() != 0};
  return joiners;
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
    std::vector<std::string> joiners;
    bool work_done = false;
    try {
      if (admit_joiners) joiners = agreeOnJoiners(context, ring);
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
    if (!joiners.empty()) admit(context, ring, joiners);
    // The state a welcome between syncs carries (RingWelcomeDesk.h): this committed sync's.
    if (admit_joiners) keepWelcomeSnapshot(context, ring);
    return;
  }
}

}  // namespace cairn
