#include "node/ring/RingClusterSync.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>
#include <thread>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/LivePeers.h"
#include "node/ring/RingCheckpoint.h"
#include "node/ring/RingMembership.h"
#include "node/ring/RingRestart.h"
#include "node/ring/RingTestHooks.h"
#include "node/ring/RingSyncMath.h"
#include "node/ring/RingThreads.h"
#include "node/ring/RingTransaction.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kLeaveSendTimeout{100};
// A joiner's connection may be new (a restarted process at the old address): the transport
// redials at least once a second (ZmqTransport), so a closed answer gets through within this,
// three redials even on a loaded machine. It is waited out only for an asker that is gone.
constexpr std::chrono::milliseconds kClosedSendTimeout{3000};

// A public call's hold on the rings (RingClusterSync.h rings_mutex_, busy_): counted busy before
// the lock is taken, until after it is released.
struct RingsBusy {
  RingsBusy(std::recursive_mutex& mutex, std::atomic<int>& count) : busy(count) {
    ++busy;
    lock = std::unique_lock<std::recursive_mutex>(mutex);
  }
  ~RingsBusy() {
    lock.unlock();
    --busy;
  }
  std::atomic<int>& busy;
  std::unique_lock<std::recursive_mutex> lock;
};

}  // namespace

RingClusterSync::RingClusterSync(Mailbox& mailbox, const NodeSpec& node, SyncOptions sync,
                                 int64_t local_steps, std::chrono::milliseconds timeout,
                                 GradientSyncOptions gradients, RingStopHook stop)
    : context_(mailbox, node, sync, timeout),
      local_steps_(std::max<int64_t>(1, local_steps)),
      gradients_(gradients) {
  std::vector<RingSpec> specs = node.rings;
  std::sort(specs.begin(), specs.end(),
            [](const RingSpec& a, const RingSpec& b) { return a.id < b.id; });
  std::set<std::string> added;
  context_.group_options.timeout = timeout;
  context_.group_options.interrupted = std::move(stop.asked);
  context_.group_options.interrupt_after = stop.grace;
  // Concurrent rings that share a link share its queues: each keeps a proportional share of the
  // in-flight window (see the header).
  const int shared_rings = static_cast<int>(std::count_if(
      specs.begin(), specs.end(), [](const RingSpec& s) { return s.members.size() > 1; }));
  if (sync.concurrent_rings && shared_rings > 1)
    context_.group_options.max_in_flight =
        std::max(1, context_.group_options.max_in_flight / shared_rings);
  for (auto& spec : specs) {
    auto ring = std::make_unique<Ring>();
    ring->spec = spec;
    ring->gradient_bucket_bytes = sync.mode == SyncMode::kGradients ? gradients.bucket_bytes : 0;
    std::vector<std::string> names;
    for (const auto& m : spec.members) {
      names.push_back(m.name);
      if (m.name != node.name && added.insert(m.name).second)
        mailbox.transport().addPeer(m.name, transportEndpointOf(m));
    }
    if (spec.members.size() > 1 && (spec.rank < 0 || size_t(spec.rank) >= names.size() ||
                                    names[size_t(spec.rank)] != node.name))
      CAIRN_THROW(BadInput, "node.json of ", node.name, ": ring ", spec.id, " rank ", spec.rank,
                  " does not name this node among its members");
    if (spec.members.size() <= 1) names = {node.name};
    regroup(context_, *ring, names, 0);
    rings_.push_back(std::move(ring));
  }
}

RingClusterSync::~RingClusterSync() {
  desk_.reset();     // its thread uses the rings
  overlap_.reset();  // its threads use the rings
}

size_t RingClusterSync::activeRings() const {
  RingsBusy busy(rings_mutex_, busy_);
  size_t n = 0;
  for (const auto& r : rings_) n += r->group ? 1 : 0;
  return n;
}

std::vector<std::string> RingClusterSync::view(const std::string& id) const {
  RingsBusy busy(rings_mutex_, busy_);
  for (const auto& r : rings_)
    if (r->spec.id == id) return r->view;
  CAIRN_THROW(BadInput, "no ring ", id, " at node ", context_.node.name);
}

int64_t RingClusterSync::generation(const std::string& id) const {
  RingsBusy busy(rings_mutex_, busy_);
  for (const auto& r : rings_)
    if (r->spec.id == id) return r->generation;
  CAIRN_THROW(BadInput, "no ring ", id, " at node ", context_.node.name);
}

void RingClusterSync::setPlacement(std::shared_ptr<const TensorPlacement> placement) {
  RingsBusy busy(rings_mutex_, busy_);
  context_.placement = std::move(placement);
}

void RingClusterSync::start(torch::jit::Module& stage) {
  RingsBusy busy(rings_mutex_, busy_);
  // A run that ended inside an armed step (a lost pipeline neighbour during the last backward)
  // leaves its communication threads waiting: stop them, and drop the hooks (a restarted run may
  // hold a new stage module) before the rings are rebuilt; the next arm hooks them again.
  overlap_.reset();
  size_t tensors = 0;
  int64_t bytes = 0;
  left_ = false;
  // Admissions decided in an earlier life are not this one's (it may resume from an earlier step).
  admit_clusters_at_.clear();
  admitted_clusters_.clear();
  last_boundary_ = 0;
  for (auto& ring : rings_) {
    if (ring->spec.members.size() <= 1) continue;  // nothing is ever exchanged
    ring->build(ring->spec.parameters, stage, context_.node.name, ring->spec.id,
                context_.node.stage_file, context_.sync.mode == SyncMode::kDiLoCo);
    for (const auto& t : ring->tensors) {
      ++tensors;
      bytes += int64_t(t.numel() * t.element_size());
    }
    if (context_.sync.mode == SyncMode::kDiLoCo)
      applyLoadedState(*ring, context_.sync.mode, &loaded_);
  }
  if (!loaded_.empty())
    CAIRN_THROW(BadInput, "checkpoint tensor ", loaded_.begin()->first, " names no ring that node ",
                context_.node.name, " shares with other clusters");
  if (joining_) expectAddedMembers();
  const bool joined_any = joining_ && joinRings(context_, sharedRings());
  if (!joined_any) {
    std::vector<Ring*> shared;
    for (auto& ring : rings_) {
      if (ring->spec.members.size() <= 1) continue;
      std::vector<std::string> all;
      for (const auto& m : ring->spec.members) all.push_back(m.name);
      // A fresh group always: one made before a peers update marked a member replaced
      // (ReplacedMembers) would fail at once on that member's new process, the one it talks to now.
      regroup(context_, *ring, all, 0);
      ring->transactions = 0;
      shared.push_back(ring.get());
    }
    // Restarting (joining_) with nobody to welcome this node: every member is restarting too.
    forEachRing(shared, context_.sync.concurrent_rings,
                [this](Ring& ring) { startTogether(context_, ring, joining_); });
  }
  started_ = true;
  ++weights_version_;
  // Join requests are answered between syncs from here on (RingWelcomeDesk.h).
  desk_.reset();
  std::vector<Ring*> all;
  for (auto& ring : rings_) {
    noteResult(context_, *ring);  // identical (checked), agreed on, or a welcome's
    keepWelcomeSnapshot(context_, *ring);
    all.push_back(ring.get());
  }
  // Gated admissions take joiners only at admission steps, never between syncs.
  if (context_.sync.mode != SyncMode::kGradients && !context_.gated && !sharedRings().empty())
    desk_ = std::make_unique<WelcomeDesk>(context_, all, rings_mutex_, busy_);
  if (activeRings() > 0) {
    std::ostringstream partners;
    for (const auto& ring : rings_) {
      if (!ring->group) continue;
      partners << " " << ring->spec.id << "[";
      bool first = true;
      for (const auto& m : ring->view)
        if (m != context_.node.name) {
          partners << (first ? "" : ",") << m;
          first = false;
        }
      partners << "]";
    }
    CAIRN_INFO("cross-cluster sync: ", toString(context_.sync.mode), ", local_steps ", local_steps_,
               ", ", activeRings(), " ring(s):", partners.str(), "; ", tensors, " tensors, ", bytes,
               joined_any ? " bytes; joined through a welcome"
                          : joining_ ? " bytes; restarted together (identical weights, or the "
                                       "newest member's)"
                                     : " bytes; identical initial weights verified");
  }
  joining_ = false;
}

void RingClusterSync::synchronize() {
  RingsBusy busy(rings_mutex_, busy_);
  CAIRN_ENFORCE(started_, "RingClusterSync::synchronize before start()");
  if (left_) return;
  const auto t0 = Clock::now();
  ++weights_version_;
  forEachRing(sharedRings(), context_.sync.concurrent_rings, [this](Ring& r) {
    transact(context_, r, /*gradients=*/false, /*admit=*/true, [this, &r] {
      switch (context_.sync.mode) {
        case SyncMode::kAverage:
          checkContributions(r, *r.group, r.result_sum);
          reduceBuckets(r, *r.group, true, true);
          testFlipAfterAverage(context_.node.name, r);
          break;
        case SyncMode::kDiLoCo:
          checkContributions(r, *r.group, r.outerStateChecksum(), "outer state (θ_prev, momentum)");
          outerStep(r, *r.group, context_.sync);
          testFlipAfterAverage(context_.node.name, r);
          break;
        case SyncMode::kGradients:
          reduceBuckets(r, *r.group, false, true);  // parameters are kept equal by the gradients
          break;
      }
    });
  });
  // The deal proposals every shared ring tallied: one offer held by every proposer, or none.
  deal_agreement_.reset();
  bool disagree = false;
  for (Ring* r : sharedRings()) {
    Ring::DealTally& t = r->deal_tally;
    if (!t.counted) continue;  // the ring took no part (this node left it meanwhile)
    t.counted = false;
    if (t.max_offer == 0) continue;
    if (t.min_offer != t.max_offer || (deal_agreement_ && deal_agreement_->offer != t.max_offer)) {
      disagree = true;
      continue;
    }
    const bool can = (!deal_agreement_ || deal_agreement_->all_can_take) && !t.any_cannot;
    const int64_t lead = std::max(deal_agreement_ ? deal_agreement_->leading_steps_done : 0,
                                  t.max_steps_done);
    const bool taken = (deal_agreement_ && deal_agreement_->taken_before) || t.any_taken;
    deal_agreement_ = DealAgreement{t.max_offer, can, lead, taken};
  }
  if (disagree) deal_agreement_.reset();
  std::lock_guard<std::mutex> lock(context_.stats_mutex);
  ++context_.stats.syncs;
  context_.stats.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  context_.stats.bytes_sent = context_.bytes_retired;
  for (auto& ring : rings_)
    if (ring->group) context_.stats.bytes_sent += ring->group->stats().bytes_sent;
}

bool RingClusterSync::agreesOnDeals() const {
  if (!started_ || left_) return false;
  for (const auto& ring : rings_)
    if (ring->spec.members.size() > 1) return true;
  return false;
}

void RingClusterSync::proposeDeal(uint64_t offer, bool can_take, bool taken) {
  context_.deal_offer = offer;
  context_.deal_can_take = can_take;
  context_.deal_taken = taken;
}

std::optional<DealAgreement> RingClusterSync::takeDealAgreement() {
  std::optional<DealAgreement> out;
  out.swap(deal_agreement_);
  return out;
}

void RingClusterSync::beforeBackward(int64_t, torch::jit::Module&, bool last_microbatch) {
  RingsBusy busy(rings_mutex_, busy_);
  if (!last_microbatch || context_.sync.mode != SyncMode::kGradients || !gradients_.overlap ||
      !started_ || left_)
    return;
  size_t with_group = 0;
  std::vector<Ring*> active;
  for (auto& ring : rings_) {
    if (!ring->group) continue;
    ++with_group;
    // A ring whose gradients are one bucket has nothing to overlap (its bucket is final only when
    // backward ends), so the thread would only add its cost: it syncs after backward, on the
    // ordinary path (docs/BENCHMARKS.md table 4, the CNN at the default 1 MiB cap).
    if (ring->gradient_buckets.size() > 1) active.push_back(ring.get());
  }
  // One after another (concurrent_rings off) is the ordinary path's order; the overlap runs rings
  // at once.
  if (active.empty() || (with_group > 1 && !context_.sync.concurrent_rings)) return;
  if (!overlap_) overlap_ = std::make_unique<GradientOverlap>(context_);
  overlap_->arm(active);
}

void RingClusterSync::beforeOptimizerStep(int64_t, torch::jit::Module&) {
  RingsBusy busy(rings_mutex_, busy_);
  if (context_.sync.mode != SyncMode::kGradients || activeRings() == 0 || left_) {
    if (overlap_) overlap_->cancel();
    return;
  }
  const auto t0 = Clock::now();
  std::vector<Ring*> active;
  for (auto& ring : rings_)
    if (ring->group) active.push_back(ring.get());
  forEachRing(active, context_.sync.concurrent_rings, [this](Ring& r) {
    if (overlap_ && overlap_->armed(&r)) {
      overlap_->complete(r);
      return;
    }
    transact(context_, r, /*gradients=*/true, /*admit=*/false,
             [&r] { averageGradients(r, *r.group); });
  });
  if (overlap_) overlap_->cancel();  // nothing is left armed (a ring that lost its group)
  std::lock_guard<std::mutex> lock(context_.stats_mutex);
  ++context_.stats.gradient_syncs;
  context_.stats.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

void RingClusterSync::afterOptimizerStep(int64_t step, torch::jit::Module& stage) {
  RingsBusy busy(rings_mutex_, busy_);
  if (started_ && !left_) applyAddedMembers(stage);
  const int64_t done = step + 1;
  last_boundary_ = done;
  // Gated: what is admitted at this boundary (earlier ones not reached are stale: dropped).
  PendingAdmission gated;
  if (auto it = admit_clusters_at_.find(done); it != admit_clusters_at_.end()) gated = it->second;
  admit_clusters_at_.erase(admit_clusters_at_.begin(), admit_clusters_at_.upper_bound(done));
  const std::set<int64_t>& clusters = gated.clusters;
  // A growth's admission: ungated at the step admitJoinersAt named, gated where the Root's did.
  const bool admission = started_ && !left_ && (admit_at_.erase(done) > 0 || gated.growth);
  if (admission) admitHeld(stage, done);
  const bool clusters_now = started_ && !left_ && !clusters.empty();
  if (clusters_now)
    awaitJoinRequests(context_, sharedRings(), std::chrono::steady_clock::now() + context_.timeout,
                      &clusters);
  if (done % local_steps_ != 0 && context_.gated && decides_ && started_ && !left_)
    admitAskersBetweenSyncs(done);
  if (done % local_steps_ != 0 && !admission && !clusters_now) return;
  bool shared = false;
  for (const auto& ring : rings_) shared = shared || ring->spec.members.size() > 1;
  if (!shared || left_) return;
  context_.last_synced_step = done;  // before the sync: a welcome sent during it names this step
  // An admitted cluster stays admissible until its member is in the view of every shared ring (a
  // join request that came too late for its admission step is taken at the next sync).
  admitted_clusters_.insert(clusters.begin(), clusters.end());
  context_.admit_all = admission;
  context_.admitting = admitted_clusters_;
  shareHeldMembers();
  synchronize();
  context_.admit_all = false;
  context_.admitting.clear();
  dropHeldTakenIn();
  for (auto it = admitted_clusters_.begin(); it != admitted_clusters_.end();) {
    bool everywhere = true;
    for (Ring* ring : sharedRings()) {
      const auto& m = ring->spec.members;
      if (*it < int64_t(m.size()) &&
          std::find(ring->view.begin(), ring->view.end(), m[size_t(*it)].name) == ring->view.end())
        everywhere = false;
    }
    it = everywhere ? admitted_clusters_.erase(it) : std::next(it);
  }
  if (context_.gated) decideAdmission(done);
}

void RingClusterSync::leave() {
  desk_.reset();  // before the rings are left: its thread answers from them
  RingsBusy busy(rings_mutex_, busy_);
  if (left_) return;
  left_ = true;
  if (overlap_) overlap_->cancel();
  std::vector<std::string> told;
  for (auto& ring : rings_) {
    if (!ring->group) continue;
    ring->group->sendLeave(kLeaveSendTimeout);
    for (const auto& m : ring->view)
      if (m != context_.node.name) told.push_back(m);
    regroup(context_, *ring, {context_.node.name}, ring->generation);
  }
  if (!sharedRings().empty())  // a node without ring peers has nothing to leave (ProviderRun's end)
    CAIRN_INFO("cross-cluster sync: ", context_.node.name, " leaves its rings; told ",
               joinedNames(told));
}

void RingClusterSync::finish(int64_t steps, torch::jit::Module& stage) {
  desk_.reset();  // the run ends here: nobody is welcomed between syncs any more
  RingsBusy busy(rings_mutex_, busy_);
  if (overlap_) overlap_->cancel();
  if (started_ && !left_) applyAddedMembers(stage);
  bool shared = false;
  for (const auto& ring : rings_) shared = shared || ring->spec.members.size() > 1;
  if (!shared || left_) return;
  if (steps != context_.last_synced_step) {
    context_.last_synced_step = steps;
    synchronize();
  }
  CAIRN_INFO("cross-cluster sync: ", context_.stats.syncs, " sync(s), ",
             context_.stats.gradient_syncs, " gradient all-reduce(s), ", context_.stats.seconds,
             " s, ", context_.stats.bytes_sent, " tensor bytes sent; members lost ",
             context_.stats.members_lost, ", left ", context_.stats.members_left, ", joined ",
             context_.stats.members_joined, ", syncs redone ", context_.stats.redone_syncs,
             "; gradient syncs overlapped with backward ", context_.stats.overlapped_gradient_syncs,
             " (buckets started during backward ", context_.stats.buckets_reduced_in_backward,
             ", copied out by backward ", context_.stats.buckets_copied_in_backward, ")");
  // The run ended: joiners it did not admit stop waiting for it (a cluster that replaced a
  // volunteer near the end and resumed from an older step: RingMembership.h answerFinished), and
  // members still training drop this node at once instead of timing out on it.
  for (Ring* ring : sharedRings()) answerFinished(context_, *ring, kClosedSendTimeout);
  leave();
}

std::vector<Ring*> RingClusterSync::sharedRings() {
  std::vector<Ring*> shared;
  for (auto& ring : rings_)
    if (ring->spec.members.size() > 1) shared.push_back(ring.get());
  return shared;
}

void RingClusterSync::saveState(std::vector<std::pair<std::string, torch::Tensor>>* tensors,
                                nlohmann::json* meta) const {
  RingsBusy busy(rings_mutex_, busy_);
  saveRingState(rings_, context_, tensors, meta);
}

void RingClusterSync::loadState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                const nlohmann::json& meta) {
  RingsBusy busy(rings_mutex_, busy_);
  loadRingState(tensors, meta, &loaded_, &context_.last_synced_step);
}

}  // namespace cairn
