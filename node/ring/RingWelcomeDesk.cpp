#include "node/ring/RingWelcomeDesk.h"

#include <algorithm>
#include <exception>

#include "core/Log.h"
#include "node/protocol/RingJoin.h"
#include "node/ring/RingMembership.h"

namespace cairn {
namespace {

constexpr std::chrono::milliseconds kDeskPoll{100};

bool viewHolds(const Ring& ring, const std::string& name) {
  return std::find(ring.view.begin(), ring.view.end(), name) != ring.view.end();
}

}  // namespace

void keepWelcomeSnapshot(RingContext& context, Ring& ring) {
  bool incomplete = false;
  for (const auto& m : ring.spec.members) incomplete = incomplete || !viewHolds(ring, m.name);
  // Gated admissions (RingClusterSync::gateAdmissions) have no desk: nothing to keep.
  if (!incomplete || ring.spec.members.size() <= 1 || context.sync.mode == SyncMode::kGradients ||
      context.gated) {
    ring.welcome_snapshot.reset();
    ring.welcome_ready = false;
    return;
  }
  Ring::WelcomeSnapshot snap;
  snap.generation = ring.generation;
  snap.transactions = ring.transactions;
  snap.step = context.last_synced_step;
  snap.checksum = ring.checksum();
  snap.tensors = welcomeTensors(ring, true);
  ring.welcome_snapshot = std::move(snap);
  ring.welcome_ready = ring.view == std::vector<std::string>{context.node.name};
}

std::optional<PendingWelcome> welcomeBetweenSyncs(RingContext& context, Ring& ring) {
  const std::string& me = context.node.name;
  if (!ring.welcome_snapshot || ring.view != std::vector<std::string>{me}) return std::nullopt;
  const Ring::WelcomeSnapshot& snap = *ring.welcome_snapshot;
  if (snap.generation != ring.generation || snap.transactions != ring.transactions)
    return std::nullopt;  // a sync changed the ring since: the snapshot is not its state
  std::vector<std::string> joiners, next;
  for (const auto& m : ring.spec.members) {
    const bool asked = m.name != me && ring.join_requests.count(m.name);
    if (asked) joiners.push_back(m.name);
    if (asked || m.name == me) next.push_back(m.name);
  }
  if (joiners.empty()) return std::nullopt;
  const int64_t generation = ring.generation + 1;
  const Welcome welcome{me,           ring.spec.id,      generation,    next,
                        snap.step,    snap.transactions, snap.checksum, snap.tensors};
  PendingWelcome pending{joiners, encode(welcome)};
  for (const auto& j : joiners) ring.join_requests.erase(j);
  ring.welcome_snapshot.reset();  // no longer alone: later joiners are admitted at a sync
  ring.welcome_ready = false;
  ring.alone_logged = false;
  context.countStats([&](RingClusterSyncStats& s) {
    s.members_joined += int64_t(joiners.size());
    s.last_welcome_checksum = snap.checksum;
  });
  CAIRN_INFO("ring ", ring.spec.id, ": admitted ", joinedNames(joiners),
             " between syncs, from the state of its sync at step ", snap.step, ", generation ",
             generation, ", view ", joinedNames(next), "; sent weights checksum ", snap.checksum);
  regroup(context, ring, next, generation);
  return pending;
}

WelcomeDesk::WelcomeDesk(RingContext& context, std::vector<Ring*> rings,
                         std::recursive_mutex& rings_mutex, const std::atomic<int>& busy)
    : context_(context), rings_mutex_(rings_mutex), busy_(busy) {
  for (Ring* ring : rings) tags_[ringControlTag(ring->spec.id)] = ring;
  thread_ = std::thread([this] { run(); });
}

WelcomeDesk::~WelcomeDesk() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_ = true;
  }
  stop_changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool WelcomeDesk::anyReady() const {
  for (const auto& [tag, ring] : tags_)
    if (ring->welcome_ready) return true;
  return false;
}

// Waits one poll (or until stopped); true when stopped.
bool WelcomeDesk::idle() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  return stop_changed_.wait_for(lock, kDeskPoll, [this] { return stop_; });
}

void WelcomeDesk::run() {
  // Called under the mailbox lock: reads the message, the constant tag map and atomics only.
  auto match = [this](const Message& x) {
    if (x.kind != MessageKind::kCollective || busy_.load() != 0) return false;
    auto it = tags_.find(x.tag);
    return it != tags_.end() && it->second->welcome_ready && !isWelcome(x);
  };
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(stop_mutex_);
      if (stop_) return;
    }
    // The mailbox is used only while some ring can answer: otherwise join requests wait there for
    // the next sync, as before, and this thread never touches the transport.
    if (!anyReady() || busy_.load() != 0) {
      if (idle()) return;
      continue;
    }
    try {
      auto m = context_.mailbox.receive(match, kDeskPoll);
      if (m) serve(std::move(*m));
    } catch (const std::exception& e) {
      // Never past this loop: a request that cannot be served is the next sync's business.
      CAIRN_WARN("cross-cluster sync: welcome desk: ", e.what());
      if (idle()) return;
    }
  }
}

void WelcomeDesk::serve(Message m) {
  std::optional<PendingWelcome> pending;
  const Ring* served = nullptr;
  {
    std::unique_lock<std::recursive_mutex> lock(rings_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      // The trainer is in a ring call (busy_ > 0 until it releases the lock, so the match does
      // not take this request again meanwhile): it is that call's to collect.
      context_.mailbox.putBack(std::move(m));
      return;
    }
    auto it = tags_.find(m.tag);
    if (it != tags_.end()) {
      Ring& ring = *it->second;
      noteJoinRequest(context_, ring, m);
      if (ring.spec.members.size() > 1) pending = welcomeBetweenSyncs(context_, ring);
      served = &ring;
    }
  }
  // The ring's id and members are not changed by a send; the lock is not needed for it.
  if (pending && served) sendWelcome(context_, *served, pending->joiners, pending->message);
}

}  // namespace cairn
