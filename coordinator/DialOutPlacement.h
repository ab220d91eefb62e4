// DialOutPlacement: where dial-out-only volunteers (behind a home router: nobody can dial them;
// docs/OPERATIONS.md "Behind a home router") may sit in a plan. Every link — pipeline neighbours,
// any two members of a ring — needs one side that can be dialled (node/transport/ReversedLinks.h):
// a link between two dial-out-only volunteers needs a relay (node/transport/RelayedLinks.h). So the
// coordinator places dial-out-only volunteers next to reachable ones first: after the planner placed the
// volunteers it checks the links, and when two dial-out-only volunteers would be linked it swaps
// volunteers of the same memory and GPUs (the plan itself is unchanged: the planner sees the same
// figures in the same order) — spare slots first, then one colour of the links' two-colouring —
// and plans again with the swapped names. The links between two dial-out-only volunteers that
// remain go through a relay (assignRelays: the relay carrying the fewest links so far); without a
// relay, planning fails with the sentence the coordinator logs while it waits for more (reachable)
// volunteers.
// Pure functions. Thread-safety: none needed.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "core/NodeData.h"

namespace cairn::coordinator {

// What a swap of two volunteers must keep equal: their memory and GPU count (a slot was planned
// for its figures); a volunteer without a readable probe is in a class of its own.
std::string swapClassOf(const Member& m);
// Every pair of node names that a plan links (pipeline neighbours; any two members of a ring).
std::vector<std::pair<std::string, std::string>> planLinks(const std::vector<NodeSpec>& nodes);
// The first link with both ends in `dial_out_only`, or nullopt.
std::optional<std::pair<std::string, std::string>> dialOutOnlyLink(
    const std::vector<NodeSpec>& nodes, const std::set<std::string>& dial_out_only);
// For the volunteers as the planner saw them (slot i: volunteers[i]'s figures), which volunteer
// takes each slot so that no link of `nodes` joins two dial-out-only ones, swapping only
// volunteers of equal memory and GPU count; nullopt when none is found.
std::optional<std::vector<size_t>> reachableNeighbourSlots(const std::vector<NodeSpec>& nodes,
                                                           const std::vector<Member>& volunteers);
// node.json of the dial-out-only volunteers: no address, "dial_out_only", in the nodes themselves
// and wherever another node names them.
void markDialOutOnly(std::vector<NodeSpec>& nodes, const std::set<std::string>& dial_out_only);
// Every link of `nodes` between two dial-out-only volunteers (marked already) gets a relay of
// `relays` (node.json "relay" in both ends' entries for each other): the one carrying the fewest
// links so far, the first on a tie; links in planLinks order. Returns how many links it relayed.
// BadInput naming the first such link when `relays` is empty.
size_t assignRelays(std::vector<NodeSpec>& nodes, const std::vector<PeerRef::Relay>& relays);
// Every link of `node` to a dial-out-only peer (both marked already) that has no relay gets the
// relay of `relays` carrying the fewest links of `nodes` (those relayed already counted), the
// first on a tie; both ends' entries for each other name it. For a node turned dial-out only
// after it was placed (a dial-out-only spare took it over: Replacement.h planReplacement).
// Returns how many links it relayed; BadInput naming the first such link when `relays` is empty.
size_t relayLinksOfNode(std::vector<NodeSpec>& nodes, const std::string& node,
                        const std::vector<PeerRef::Relay>& relays);
// Every relayed link of `nodes` whose relay is not in `alive` (names) moves to the relay of
// `targets` carrying the fewest links (those that stay counted), the first on a tie, in planLinks
// order; both ends' node.json entries change. Nothing moves when `targets` is empty. Returns the
// names of the nodes whose node.json changed.
std::set<std::string> reassignRelays(std::vector<NodeSpec>& nodes, const std::set<std::string>& alive,
                                     const std::vector<PeerRef::Relay>& targets);
// What the relay named `relay` must admit and forward for `nodes` (node.json as planned or as a
// replacement rewrote it): every member on either end of a link through it, with its key, and the
// links, each pair once (lesser name first).
struct RelayLinks {
  std::map<std::string, std::string> members;  // node name → Z85 public key
  std::set<std::pair<std::string, std::string>> pairs;
};
RelayLinks relayLinksOf(const std::vector<NodeSpec>& nodes, const std::string& relay);

}  // namespace cairn::coordinator
