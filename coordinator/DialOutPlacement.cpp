#include "coordinator/DialOutPlacement.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "core/Error.h"

#include <nlohmann/json.hpp>

namespace cairn::coordinator {

std::string swapClassOf(const Member& m) {
  const nlohmann::json probe = nlohmann::json::parse(m.probe_json, nullptr, false);
  if (!probe.is_object()) return m.name;  // never swapped
  const size_t gpus = probe.contains("gpus") && probe["gpus"].is_array() ? probe["gpus"].size() : 0;
  return std::to_string(probe.value("ram_gb", 0.0)) + "/" + std::to_string(gpus);
}

namespace {

// Slots in the order they take dial-out-only volunteers: unplaced (no links) first, then the
// placed ones by a breadth-first two-colouring of the links (colour 0, then colour 1).
std::vector<size_t> dialOutSlotOrder(const std::vector<std::vector<size_t>>& adjacent,
                                     const std::vector<bool>& placed) {
  std::vector<int> colour(adjacent.size(), -1);
  for (size_t start = 0; start < adjacent.size(); ++start) {
    if (!placed[start] || colour[start] >= 0) continue;
    colour[start] = 0;
    std::deque<size_t> queue{start};
    while (!queue.empty()) {
      const size_t at = queue.front();
      queue.pop_front();
      for (size_t next : adjacent[at])
        if (colour[next] < 0) {
          colour[next] = 1 - colour[at];
          queue.push_back(next);
        }
    }
  }
  std::vector<size_t> order;
  for (int want : {-1, 0, 1})
    for (size_t i = 0; i < adjacent.size(); ++i)
      if (colour[i] == want) order.push_back(i);
  return order;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> planLinks(const std::vector<NodeSpec>& nodes) {
  std::set<std::pair<std::string, std::string>> links;
  auto link = [&](const std::string& a, const std::string& b) {
    if (a != b) links.insert(a < b ? std::make_pair(a, b) : std::make_pair(b, a));
  };
  for (const NodeSpec& n : nodes) {
    if (n.upstream) link(n.name, n.upstream->name);
    if (n.downstream) link(n.name, n.downstream->name);
    for (const RingSpec& ring : n.rings)
      for (const PeerRef& m : ring.members) link(n.name, m.name);
  }
  return {links.begin(), links.end()};
}

std::optional<std::pair<std::string, std::string>> dialOutOnlyLink(
    const std::vector<NodeSpec>& nodes, const std::set<std::string>& dial_out_only) {
  for (const auto& [a, b] : planLinks(nodes))
    if (dial_out_only.count(a) && dial_out_only.count(b)) return std::make_pair(a, b);
  return std::nullopt;
}

std::optional<std::vector<size_t>> reachableNeighbourSlots(const std::vector<NodeSpec>& nodes,
                                                           const std::vector<Member>& volunteers) {
  std::map<std::string, size_t> slot_of;
  for (size_t i = 0; i < volunteers.size(); ++i) slot_of[volunteers[i].name] = i;
  std::vector<std::vector<size_t>> adjacent(volunteers.size());
  std::vector<bool> placed(volunteers.size(), false);
  for (const NodeSpec& n : nodes)
    if (slot_of.count(n.name)) placed[slot_of[n.name]] = true;
  for (const auto& [a, b] : planLinks(nodes)) {
    if (!slot_of.count(a) || !slot_of.count(b)) continue;
    adjacent[slot_of[a]].push_back(slot_of[b]);
    adjacent[slot_of[b]].push_back(slot_of[a]);
  }
  const std::vector<size_t> order = dialOutSlotOrder(adjacent, placed);
  std::vector<size_t> taken_by(volunteers.size(), volunteers.size());
  std::vector<bool> dial_out_slot(volunteers.size(), false);
  // Per swap class: its dial-out-only volunteers into the first slots of that class that have no
  // dial-out-only neighbour yet; its reachable ones into the rest, in their order.
  std::map<std::string, std::vector<size_t>> members_of;
  for (size_t i = 0; i < volunteers.size(); ++i) members_of[swapClassOf(volunteers[i])].push_back(i);
  for (const auto& [cls, members] : members_of) {
    std::deque<size_t> dial_out, reachable;
    for (size_t m : members) (volunteers[m].dial_out_only ? dial_out : reachable).push_back(m);
    for (size_t slot : order) {
      if (dial_out.empty()) break;
      if (swapClassOf(volunteers[slot]) != cls) continue;
      bool clear = true;
      for (size_t next : adjacent[slot]) clear = clear && !dial_out_slot[next];
      if (!clear) continue;
      dial_out_slot[slot] = true;
      taken_by[slot] = dial_out.front();
      dial_out.pop_front();
    }
    if (!dial_out.empty()) return std::nullopt;
    for (size_t slot : members)
      if (!dial_out_slot[slot]) {
        taken_by[slot] = reachable.front();
        reachable.pop_front();
      }
  }
  return taken_by;
}

void markDialOutOnly(std::vector<NodeSpec>& nodes, const std::set<std::string>& dial_out_only) {
  auto mark = [&](PeerRef& p) {
    if (!dial_out_only.count(p.name)) return;
    p.dial_out_only = true;
    p.address.clear();
  };
  for (NodeSpec& n : nodes) {
    if (dial_out_only.count(n.name)) {
      n.dial_out_only = true;
      n.address.clear();
    }
    if (n.upstream) mark(*n.upstream);
    if (n.downstream) mark(*n.downstream);
    for (RingSpec& ring : n.rings)
      for (PeerRef& m : ring.members) mark(m);
  }
}

namespace {

// The PeerRefs naming `peer` in `node` (upstream, downstream, ring members).
std::vector<PeerRef*> refsTo(NodeSpec& node, const std::string& peer) {
  std::vector<PeerRef*> refs;
  if (node.upstream && node.upstream->name == peer) refs.push_back(&*node.upstream);
  if (node.downstream && node.downstream->name == peer) refs.push_back(&*node.downstream);
  for (RingSpec& ring : node.rings)
    for (PeerRef& m : ring.members)
      if (m.name == peer) refs.push_back(&m);
  return refs;
}

// The link of `a` and `b` goes through the relay of `relays` with the least `load` (the first on
// a tie), named in both ends' entries for each other; that relay's load grows by one.
void throughLeastLoaded(NodeSpec& a, NodeSpec& b, const std::vector<PeerRef::Relay>& relays,
                        std::vector<size_t>& load) {
  const size_t pick = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
  ++load[pick];
  for (PeerRef* ref : refsTo(a, b.name)) ref->relay = relays[pick];
  for (PeerRef* ref : refsTo(b, a.name)) ref->relay = relays[pick];
}

}  // namespace

size_t assignRelays(std::vector<NodeSpec>& nodes, const std::vector<PeerRef::Relay>& relays) {
  std::map<std::string, NodeSpec*> by_name;
  for (NodeSpec& n : nodes) by_name[n.name] = &n;
  std::vector<size_t> load(relays.size(), 0);
  size_t relayed = 0;
  for (const auto& [a, b] : planLinks(nodes)) {
    NodeSpec* na = by_name.count(a) ? by_name[a] : nullptr;
    NodeSpec* nb = by_name.count(b) ? by_name[b] : nullptr;
    if (!na || !nb || !na->dial_out_only || !nb->dial_out_only) continue;
    if (relays.empty())
      CAIRN_THROW(BadInput, "the plan links ", a, " and ", b, ", both dial-out only (behind a router: "
                  "nobody can dial either), and no swap with a reachable volunteer of the same memory "
                  "avoids it; such a link needs a relay, and none is offered (a volunteer's "
                  "`provider --join … --relay`, or the coordinator's --relay): more reachable "
                  "volunteers are needed");
    throughLeastLoaded(*na, *nb, relays, load);
    ++relayed;
  }
  return relayed;
}

size_t relayLinksOfNode(std::vector<NodeSpec>& nodes, const std::string& node,
                        const std::vector<PeerRef::Relay>& relays) {
  std::map<std::string, NodeSpec*> by_name;
  for (NodeSpec& n : nodes) by_name[n.name] = &n;
  std::vector<size_t> load(relays.size(), 0);
  for (const auto& [a, b] : planLinks(nodes)) {  // the links each relay carries already
    if (!by_name.count(a)) continue;
    const std::vector<PeerRef*> refs = refsTo(*by_name[a], b);
    if (refs.empty() || !refs[0]->relay) continue;
    for (size_t i = 0; i < relays.size(); ++i)
      if (relays[i].name == refs[0]->relay->name) ++load[i];
  }
  size_t relayed = 0;
  for (const auto& [a, b] : planLinks(nodes)) {
    if (a != node && b != node) continue;
    NodeSpec* na = by_name.count(a) ? by_name[a] : nullptr;
    NodeSpec* nb = by_name.count(b) ? by_name[b] : nullptr;
    if (!na || !nb || !na->dial_out_only || !nb->dial_out_only) continue;
    const std::vector<PeerRef*> refs = refsTo(*na, b);
    if (!refs.empty() && refs[0]->relay) continue;
    if (relays.empty())
      CAIRN_THROW(BadInput, "the link between ", a, " and ", b, " joins two dial-out-only volunteers "
                  "now, and no relay is offered (a volunteer's `provider --join … --relay`, or the "
                  "coordinator's --relay)");
    throughLeastLoaded(*na, *nb, relays, load);
    ++relayed;
  }
  return relayed;
}

std::set<std::string> reassignRelays(std::vector<NodeSpec>& nodes, const std::set<std::string>& alive,
                                     const std::vector<PeerRef::Relay>& targets) {
  std::map<std::string, NodeSpec*> by_name;
  for (NodeSpec& n : nodes) by_name[n.name] = &n;
  // The relayed links, each with the relay its first end names for it.
  std::vector<std::tuple<NodeSpec*, NodeSpec*, std::string>> relayed;
  for (const auto& [a, b] : planLinks(nodes)) {
    if (!by_name.count(a) || !by_name.count(b)) continue;
    const std::vector<PeerRef*> refs = refsTo(*by_name[a], b);
    if (!refs.empty() && refs[0]->relay) relayed.emplace_back(by_name[a], by_name[b], refs[0]->relay->name);
  }
  std::vector<size_t> load(targets.size(), 0);
  for (const auto& [na, nb, relay] : relayed)
    for (size_t i = 0; i < targets.size(); ++i)
      if (alive.count(relay) && targets[i].name == relay) ++load[i];
  std::set<std::string> changed;
  for (const auto& [na, nb, relay] : relayed) {
    if (alive.count(relay) || targets.empty()) continue;
    throughLeastLoaded(*na, *nb, targets, load);
    changed.insert(na->name);
    changed.insert(nb->name);
  }
  return changed;
}

RelayLinks relayLinksOf(const std::vector<NodeSpec>& nodes, const std::string& relay) {
  RelayLinks links;
  std::map<std::string, std::string> keys;
  for (const NodeSpec& n : nodes)
    if (n.extra.contains("public_key") && n.extra["public_key"].is_string())
      keys[n.name] = n.extra["public_key"].get<std::string>();
  auto take = [&](const NodeSpec& n, const PeerRef& ref) {
    if (!ref.relay || ref.relay->name != relay) return;
    links.members[n.name] = keys.count(n.name) ? keys[n.name] : "";
    links.members[ref.name] = ref.public_key;
    links.pairs.insert(std::minmax(n.name, ref.name));
  };
  for (const NodeSpec& n : nodes) {
    if (n.upstream) take(n, *n.upstream);
    if (n.downstream) take(n, *n.downstream);
    for (const RingSpec& ring : n.rings)
      for (const PeerRef& m : ring.members) take(n, m);
  }
  return links;
}

}  // namespace cairn::coordinator
