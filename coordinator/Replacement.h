// Replacement: the coordinator's decisions when a placed volunteer is lost (docs/OPERATIONS.md
// "A lost volunteer is replaced by a spare"), as pure functions of the members, the plan's node
// names and node.json files — no store, no sockets, no clock:
//   findLost          which placed nodes need a new holder: their volunteer sent no heartbeat for
//                     longer than --lost-after-s (counted from the coordinator's own start too, so
//                     a restarted coordinator does not call everyone lost), closed every connection
//                     to the coordinator and sent nothing for --gone-after-s (GoneRule: its process
//                     ended), said `leaving`, or was lost earlier and is still unreplaced
//   chooseSpare       which waiting spare takes a lost node over: the first of those that can hold
//                     it (sparesFor: a node placed dial-out only can go to a reachable spare, one
//                     placed reachable to a dial-out-only spare, its links then turned around)
//                     whose RAM holds the stage's estimate; spareNote / tooSmallNote: what a spare
//                     is told about why it waits
//   planReplacement   the lost node's node.json with the spare's address (none for a node placed
//                     dial-out only, whoever holds it, or now held dial-out only) and public key, and every
//                     other node.json that names the lost node (pipeline neighbours, ring peers in
//                     other clusters) re-pointed to them: those members are sent `peers`
//   lostRowName       the name the lost volunteer's store row is kept under, so that the node name
//                     passes to the spare while the lost key stays known (and refused if it
//                     comes back)
// MemberReplacer.h carries the decisions out. Thread-safety: pure functions.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "core/NodeData.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

struct LostNode {
  std::string name;     // the node name (and its holder's member name)
  std::string why;      // for the log: "no heartbeat for 16.2 s", "it left (stopped)", …
  bool newly = false;   // true: its holder was still `assigned` (the store marks it lost now)
};

// A volunteer whose connections to the coordinator all closed (ConnectionWatch.h): `gone_since`
// answers, for a member's public key, since when (nullopt: one is open, or it spoke since). Such a
// volunteer is gone once now - since > gone_after_s. Off when gone_after_s <= 0 or gone_since is
// empty.
struct GoneRule {
  std::function<std::optional<double>(const std::string& public_key)> gone_since;
  double gone_after_s = 0;
  // How long `m` has been gone past the rule (seconds since its connections closed), or nullopt.
  std::optional<double> goneFor(const Member& m, double now) const;
};

// `placed`: the plan's node names; `now`, `heard_since` (when this coordinator started) and
// `lost_after_s` in seconds. A holder counts as silent when now - max(last_seen, heard_since) >
// lost_after_s, and as gone by `gone` (its process ended) sooner. Holders that are done (result
// received) are never lost. In `placed` order.
std::vector<LostNode> findLost(const std::vector<Member>& members,
                               const std::vector<std::string>& placed, double now,
                               double heard_since, double lost_after_s, const GoneRule& gone = {});
// Whether `m` was heard lately enough to be planned or given a node: not gone by `gone`, and not
// silent for over lost_after_s (now - max(last_seen, heard_since), as findLost counts it).
bool heardLately(const Member& m, double now, double heard_since, double lost_after_s, const GoneRule& gone);
// `members` without the spares not heardLately (a spare whose process ended, or that is frozen or
// cut off, takes nothing over and is not planned).
std::vector<Member> withoutAwaySpares(std::vector<Member> members, double now, double heard_since,
                                      double lost_after_s, const GoneRule& gone);

// The RAM (GB) a member's join probe reports (0 when it reports none).
double probeRamGb(const Member& m);
// The RAM (GB) a spare needs to take `node` over: its stage's estimate (node.json
// estimates.memory_bytes), or, for a node without one, what its lost holder reported.
double neededGb(const NodeSpec& node, const Member& lost);
// The earliest-joined spare (members() order) whose probe reports at least `needed_gb`; nullopt
// when none.
std::optional<Member> chooseSpare(const std::vector<Member>& members, double needed_gb);
// Whether `spare` can hold `node` (its node.json as placed now). Any volunteer can hold a node
// placed dial-out only: it listens on nothing and dials its peers (or meets them at a relay), a
// reachable volunteer included. A node placed reachable is dialled by its peers; a reachable spare
// holds it as placed, and a dial-out-only one turns its links around (planReplacement): its
// reachable peers accept its dial from then on (node/transport/ReversedLinks.h), and its
// dial-out-only peers meet it at a relay, so with such a peer it needs `relays_offered`.
bool canHold(const Member& spare, const NodeSpec& node, bool relays_offered);
// The peers `node` names (pipeline neighbours, ring members) that are placed dial-out only, each
// once, in name order.
std::vector<std::string> dialOutOnlyPeersOf(const NodeSpec& node);
// The spares that may take over `node`, in the order chooseSpare should try them: those of the
// node's own kind first (members() order: a node placed reachable keeps its links as they are
// with a reachable spare), then those of the other kind that canHold it.
std::vector<Member> sparesFor(const std::vector<Member>& members, const NodeSpec& node,
                              bool relays_offered);
// What a spare hears about its wait (Accepted::note), from the plan's nodes (empty: no plan yet):
// which nodes it could take over (the stage fits in the RAM it gives, and canHold), which need more
// RAM, which it cannot hold (canHold: placed reachable with dial-out-only peers, no relay offered,
// while it joined dial-out only); or that none fits.
std::string spareNote(const Member& spare, const std::vector<NodeSpec>& placed, bool relays_offered);
// What a spare too small for `node` hears when that node needs a new holder.
std::string tooSmallNote(const Member& spare, const std::string& node, double needed_gb);
// What a dial-out-only spare hears when `node`, placed reachable with dial-out-only peers, needs a
// new holder and no relay is offered (canHold).
std::string unlikeReachNote(const NodeSpec& node);

// Why the holder `m` of a node placed as `node_dial_out_only` cannot take it back when it comes back
// `reachable` or not (a restarted volunteer, joining again): a node placed reachable is dialled by
// its peers, so its holder must be reachable again; one placed dial-out only dials its peers, which
// its holder does either way. nullopt: it may.
std::optional<std::string> holderCannotComeBack(const Member& m, bool reachable, bool node_dial_out_only);

struct ReplacementPlan {
  NodeSpec taken_over;           // the lost node's node.json: the spare's address and public key
  std::vector<NodeSpec> told;    // every other node naming the lost node, re-pointed, by name
  bool turned = false;           // placed reachable, now dial-out only (its links turned around)
  size_t relayed = 0;            // links of it that go through a relay from now on (turned only)
};

// `nodes`: every placed node's node.json. BadInput when `lost_name` is not among them.
// `new_address` is not written for a node placed dial-out only (its node.json and its peers'
// references keep no address). A node placed reachable whose new holder is dial-out only
// (`holder_dial_out_only`) is placed dial-out only from now on, everywhere it is named
// (DialOutPlacement markDialOutOnly), and each of its links to a dial-out-only peer goes through
// the relay of `relays` carrying the fewest links (relayLinksOfNode; BadInput when there is such a
// link and no relay: canHold said no).
ReplacementPlan planReplacement(const std::vector<NodeSpec>& nodes, const std::string& lost_name,
                                const std::string& new_address, const std::string& new_public_key,
                                bool holder_dial_out_only = false,
                                const std::vector<PeerRef::Relay>& relays = {});

// Re-points every reference to `peer` in `node` (upstream, downstream, ring members); true when
// there was one.
bool repointPeer(NodeSpec& node, const std::string& peer, const std::string& address,
                 const std::string& public_key);

// "<name>-lost-<n>" with the smallest n >= 1 no member is called.
std::string lostRowName(const std::string& name, const std::vector<Member>& members);
// True for a name lostRowName makes.
bool isLostRowName(const std::string& name);
// What the coordinator answers a member whose row is `row` when it speaks as `claimed` (a
// heartbeat, an upload): for a row that lost `claimed` to a spare ("node_1-lost-1" speaking as
// node_1: a volunteer frozen or cut off past --lost-after-s, then back) `node_taken` and the
// sentence that tells it so (provider --join then gives the node up and joins again as a spare);
// "you are not <claimed>: join first" otherwise.
Rejected notThisMember(const std::string& row, const std::string& claimed);

}  // namespace cairn::coordinator
