// MemberReplacer: the coordinator carrying out Replacement.h's decisions (docs/OPERATIONS.md "A
// lost volunteer is replaced by a spare"):
//   poll()         every 200 ms while the run is planned: a placed volunteer silent for longer
//                  than --lost-after-s, whose connections all closed --gone-after-s ago
//                  (watchConnections), or that said `leaving` is marked lost; when a spare
//                  heard lately (heardLately) is waiting it takes the node over: the store
//                  renames the rows (CoordinatorStore::takeOver), node.json of the node and of
//                  every node naming it are rewritten (a dial-out-only spare taking a node placed
//                  reachable: the node dial-out only from then on, Replacement.h) in
//                  <out>/nodes/ (the plan a restarted coordinator reads), the spare is sent
//                  `accepted{name: the node's name, state: assigned}` and the `assignment` with
//                  the newest checkpoint the coordinator holds for the node (resume), and the
//                  members to tell are remembered in coordinator.db (meta peers_pending)
//   onHeartbeat()  a member owed an update gets `peers{name, node}` on the connection its
//                  heartbeat just came from (its heartbeat socket, the one it reads them on) —
//                  sent at once too when replace() rewrote its node.json, on the connection its
//                  last heartbeat came from (sendAtOnce; the volunteer ignores the repeat); a
//                  member marked lost but not yet replaced holds its node again (it was frozen
//                  or cut off, and is back)
// A lost node that had finished (its final checkpoint held) needs no spare: onLostAfterFinishing.
// Without a spare the node stays lost (its cluster waits, timeouts.max_wait_s) until one joins; a
// waiting spare whose RAM cannot hold the node's stage is told why (`accepted` with a note), once.
//   spareNote()    what a spare is told about its wait once the run is planned (Replacement.h)
// Ownership: borrows the store; sends through the coordinator's `send`.
// Thread-safety: the coordinator's loop thread only.
#pragma once

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/NodeHeaders.h"
#include "coordinator/Replacement.h"
#include "core/NodeData.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

class MemberReplacer {
 public:
  // Sends `frames` to the member holding `public_key` (on its last connection).
  using Send = std::function<void(const std::string& public_key, const Frames& frames)>;
  // `started_at`: when this coordinator started (seconds since the epoch, like last_seen).
  MemberReplacer(CoordinatorStore& store, std::string out, double lost_after_s, double started_at,
                 Send send);

  void poll(double now);
  // Asked for every lost node before a spare is sought: true when it was done with instead (the
  // coordinator made its result from its final checkpoint, FinalResult.h).
  void onLostAfterFinishing(std::function<bool(const std::string& name)> finished) { finished_ = std::move(finished); }
  // The coordinator heard nobody until `t` (its loop was planning): silence counts from then at the
  // earliest, as from its start; else every placed volunteer would be lost after a long plan.
  void deafUntil(double t) { started_at_ = std::max(started_at_, t); }
  // Volunteers whose connections all closed are lost after `rule.gone_after_s` (Replacement.h).
  void watchConnections(GoneRule rule) { gone_ = std::move(rule); }
  // Replacement.h heardLately by this replacer's clock and rules: a spare that is not is passed
  // over (it is dead, frozen or cut off), here and by the first plan (Gathering.h).
  bool heardLately(const Member& m, double now) const {
    return coordinator::heardLately(m, now, started_at_, lost_after_s_, gone_);
  }
  // `member`: the row of the heartbeat's sender (the coordinator has it at hand: no lookup here).
  void onHeartbeat(const Member& member);
  // Sends `frames` to `public_key` on the connection its last heartbeat came from; false when
  // none is known (nothing sent).
  using SendOnHeartbeats = std::function<bool(const std::string& public_key, const Frames& frames)>;
  // The peers a replacement re-points are sent their node.json at once through `send` as well as
  // on their next heartbeat (which a lost message, its connection gone meanwhile, cannot miss):
  // their clusters restart with the spare up to a heartbeat interval sooner.
  void sendAtOnce(SendOnHeartbeats send) { send_at_once_ = std::move(send); }
  // `names` are owed their node.json as a `peers` update (their node.json changed: a relay was
  // replaced, VolunteerRelays.h), sent like a replacement's on their next heartbeat.
  void owePeers(const std::set<std::string>& names);
  // The relays a node turned dial-out only may use for its links to dial-out-only peers
  // (VolunteerRelays::forPlanning); none until given: a dial-out-only spare then takes over only
  // a node placed reachable all of whose peers are reachable (Replacement.h canHold).
  using Relays = std::function<std::vector<PeerRef::Relay>()>;
  void relayThrough(Relays relays) { relays_ = std::move(relays); }
  // Replacement.h's spareNote for `spare` against the plan's nodes ("" before the plan).
  std::string spareNote(const Member& spare) const;

  uint64_t replaced() const { return replaced_; }

 private:
  void replace(const Member& lost, const Member& spare, double now,
               const std::vector<PeerRef::Relay>& relays);
  std::set<std::string> pending() const;
  void setPending(const std::set<std::string>& names);

  CoordinatorStore& store_;
  std::string out_;
  double lost_after_s_, started_at_;
  GoneRule gone_;  // off until watchConnections
  Send send_;
  SendOnHeartbeats send_at_once_;  // empty: peers go out on heartbeats only
  std::function<bool(const std::string&)> finished_;
  Relays relays_;  // empty: no relays
  std::set<std::string> told_no_spare_;  // lost nodes already logged as waiting for a spare
  std::set<std::pair<std::string, std::string>> told_why_not_;  // (spare, node) told why not
  std::vector<std::string> placedNames() const;  // meta "placed"
  mutable NodeHeaders headers_;  // the placed nodes' node.json headers, parsed once per version
  uint64_t replaced_ = 0;
};

}  // namespace cairn::coordinator
