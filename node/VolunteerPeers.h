// VolunteerPeers: a training volunteer applying the coordinator's `peers` updates (a neighbour or
// ring peer was lost and a spare took its node over; docs/OPERATIONS.md "A lost volunteer is
// replaced by a spare"). What is built is the restart, not live re-pointing: an update waits
// until this node's cluster has paused on the lost neighbour (NodeRunner's "paused" event), then
// the paused run is stopped (stop_requested: the wait for the lost node ends, nothing is
// announced to the neighbours), the checked node.json is written, and the volunteer runs its
// stage again in-process with resume — the cluster agrees on the newest common checkpoint
// exactly as `provider --resume` does, the replacement included. A node that never pauses (a
// ring peer in another cluster) keeps its update pending: it is not applied there.
//
// Ownership: plain state. Thread-safety: offer() from the heartbeats' thread, the watch()ed
// event function from the trainer's thread, the stop predicate from any, applyPending() from the
// volunteer's main thread once runProvider returned.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "node/protocol/Coordination.h"

namespace cairn {

class VolunteerPeers {
 public:
  VolunteerPeers(std::string node_data, std::string name, std::string own_public_key,
                 std::string coordinator);

  // Keeps `update` (the newest wins) until the run pauses.
  void offer(const PeersUpdate& update);
  // Wraps a ProviderRunOptions::on_event: notes {"state": "paused"|"resumed"|…}, then calls `inner`.
  std::function<void(const nlohmann::json&)> watch(std::function<void(const nlohmann::json&)> inner);
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
  std::atomic<bool> has_pending_{false}, paused_{false};
};

}  // namespace cairn
