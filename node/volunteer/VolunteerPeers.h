// VolunteerPeers: a training volunteer applying the coordinator's `peers` updates (a neighbour or
// ring peer was lost and a spare took its node over; docs/OPERATIONS.md "A lost volunteer is
// replaced by a spare"). Two ways, by what changed (the update is checked first,
// checkPeersUpdate):
//   * a pipeline neighbour (upstream/downstream): the update waits until this node's cluster has
//     paused on the lost neighbour (NodeRunner's "paused" event; a wait on the re-pointed
//     neighbour ends at once as its loss, replacedHook, so a holder that froze or was cut off with
//     its connection open does not keep it waiting) — or applies at once while the run
//     has not started training yet (before its "plan" event: connecting to its neighbours, agreeing
//     on the resume step; a spare given a node whose neighbour is replaced right after would
//     otherwise wait for the old neighbour's address until startup_s) — then the run is stopped
//     (stop_requested: the wait for the lost node ends, nothing is announced to the neighbours),
//     the node.json is written, and the volunteer runs its stage again in-process with resume —
//     the cluster agrees on the newest common checkpoint exactly as `provider --resume` does, the
//     replacement included;
//   * only ring peers (the node is in another cluster and keeps training): applied live at once
//     through the running provider's LivePeers (transport re-pointed, ZAP list replaced) and the
//     node.json written, so the replacement's ring join is admitted and answered.
//
// Ownership: plain state. Thread-safety: offer() from the heartbeats' thread, the watch()ed
// event function from the trainer's thread, the stop predicate from any, applyPending() from the
// volunteer's main thread once runProvider returned.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "node/pipeline/ProviderRun.h"
#include "node/protocol/Coordination.h"

namespace cairn {

class VolunteerPeers {
 public:
  VolunteerPeers(std::string node_data, std::string name, std::string own_public_key,
                 std::string coordinator);

  // Checks `update`; applies it live when only ring peers changed and a run is up, else keeps it
  // (the newest wins) until the run pauses. One that does not check is logged and dropped.
  void offer(const PeersUpdate& update);
  // ProviderRunOptions::on_live_peers: the running provider's live re-pointing (empty: none).
  std::function<void(LivePeersApply)> liveHook();
  // Wraps a ProviderRunOptions::on_event: notes {"state": "paused"|"resumed"|…}, then calls `inner`.
  std::function<void(const nlohmann::json&)> watch(std::function<void(const nlohmann::json&)> inner);
  // ProviderRunOptions::neighbour_replaced: true for a pipeline neighbour whose address or key a
  // pending update changes (its node went to another volunteer): the run's wait on it ends, its
  // cluster pauses, and the update is applied (before, a frozen or cut-off holder whose
  // connection stayed open kept this node waiting on it while its replacement was refused).
  std::function<bool(const std::string&)> replacedHook();
  // A ProviderRunOptions::stop_requested: `signal` (may be empty), or an update is pending while
  // the run is paused.
  std::function<bool()> stopWhenReplaced(std::function<bool()> signal);
  // After runProvider returned stopped: writes the pending update's node.json (checked with
  // checkPeersUpdate) and returns true (run again with resume); false when none was pending or
  // it did not check (logged).
  bool applyPending();
  bool pending() const { return has_pending_.load(); }

 private:
  std::string node_data_, name_, own_public_key_, coordinator_;
  std::mutex mutex_;
  std::optional<PeersUpdate> update_;  // under mutex_
  std::set<std::string> replaced_;     // neighbours update_ re-points; under mutex_
  LivePeersApply live_;                // under mutex_
  std::atomic<bool> has_pending_{false};
  // Not training: paused on a lost neighbour, or not started yet (true until the run's "plan").
  std::atomic<bool> not_training_{true};
};

}  // namespace cairn
