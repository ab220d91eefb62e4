// VolunteerRelays: the relays volunteers offer (`provider --join … --relay`; docs/OPERATIONS.md
// "Behind a home router"), as the coordinator keeps them: members in state `relaying`, never
// placed and never spares. Links between two dial-out-only volunteers go through them first; the
// coordinator's own relay (--relay) only when no volunteer relay is there, since a link through it
// puts the coordinator on that link's hot path.
//   forPlanning()  the relays a plan may use: the live volunteer relays, else the coordinator's
//   onHeartbeat()  a relay's heartbeat: its figures kept for the live view, and `relay_links`
//                  (what it admits and forwards: relayLinksOf the placed nodes' node.json) sent
//                  back on that connection when they changed since it was last told, and every
//                  5 s anyway (a relay that restarted, or missed one, hears them again)
//   poll()         every 200 ms: a relay silent for longer than --lost-after-s, or whose
//                  connections all closed --gone-after-s ago (watchConnections), is lost (no state
//                  change: it is alive again when heard again); every relayed link whose relay is
//                  not alive moves to the relay of forPlanning() carrying the fewest links
//                  (DialOutPlacement reassignRelays): both ends' node.json rewritten, returned so
//                  the coordinator owes those nodes a `peers` update (MemberReplacer::owePeers).
//                  A volunteer applies a relay-only change live (node/volunteer/VolunteerPeers.h:
//                  the transport re-points the link, nothing resent is lost); the link waits
//                  meanwhile as for a peer lost and back.
// Ownership: borrows the store; sends through the coordinator's `send`.
// Thread-safety: the coordinator's loop thread only.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/DialOutPlacement.h"
#include "coordinator/Replacement.h"
#include "core/NodeData.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

class VolunteerRelays {
 public:
  using Send = std::function<void(const std::string& public_key, const Frames& frames)>;
  // `coordinator_relay`: the coordinator's own relay (--relay), if any.
  VolunteerRelays(CoordinatorStore& store, std::string out, double lost_after_s, double started_at,
                  std::optional<PeerRef::Relay> coordinator_relay, Send send);

  std::vector<PeerRef::Relay> forPlanning(double now) const;
  void onHeartbeat(const Member& member, const Heartbeat& beat, double now);
  // Returns the nodes whose node.json changed (their relay was lost).
  std::set<std::string> poll(double now);
  void deafUntil(double t) { started_at_ = std::max(started_at_, t); }
  // Relays whose connections all closed are lost after `rule.gone_after_s` (Replacement.h).
  void watchConnections(GoneRule rule) { gone_ = std::move(rule); }
  // The live view's "relays": per volunteer relay its name, address, whether alive, its figures.
  nlohmann::json figures(double now) const;
  // The live view's "links" (as of the last poll that read the placed nodes): how many links of
  // the plan are direct, opened by a dial-out-only end ("dial_out") and relayed, and every link
  // that is not direct: {"a", "b", "via": "dial-out" or the relay's name}.
  const nlohmann::json& linksView() const { return links_view_; }
  uint64_t linksViewVersion() const { return links_view_version_; }  // changes with linksView()

 private:
  bool alive(const Member& m, double now) const;
  std::vector<PeerRef::Relay> liveRelays(double now) const;
  // The placed nodes' node.json, whole (relays change rarely: read only when the members moved).
  std::vector<NodeSpec> placedNodes() const;

  CoordinatorStore& store_;
  std::string out_;
  double lost_after_s_, started_at_;
  GoneRule gone_;  // off until watchConnections
  std::optional<PeerRef::Relay> coordinator_relay_;
  Send send_;
  uint64_t links_version_ = ~uint64_t{0};     // the members' version last looked at
  std::string holders_;                       // the placed nodes and their keys links_ are from
  std::set<std::string> alive_;               // relay names alive at the last poll
  std::map<std::string, RelayLinks> links_;   // relay name → what it must admit, as placed
  struct Told {
    RelayLinks links;
    double at = 0;
  };
  std::map<std::string, Told> told_;                 // relay name → what it was last sent
  std::map<std::string, RelayFigures> figures_;      // relay name → its last heartbeat's
  nlohmann::json links_view_ = nlohmann::json::object();
  uint64_t links_view_version_ = 0;
};

}  // namespace cairn::coordinator
