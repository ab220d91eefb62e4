#include "coordinator/Replacement.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "coordinator/DialOutPlacement.h"
#include "core/Error.h"
#include "node/transport/LivePeers.h"

namespace cairn::coordinator {
namespace {

std::string gbText(double gb) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB", gb);
  return text;
}

std::string secondsText(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", s);
  return text;
}

}  // namespace

std::optional<double> GoneRule::goneFor(const Member& m, double now) const {
  if (gone_after_s <= 0 || !gone_since) return std::nullopt;
  const std::optional<double> since = gone_since(m.public_key);
  if (!since || now - *since <= gone_after_s) return std::nullopt;
  return now - *since;
}

bool heardLately(const Member& m, double now, double heard_since, double lost_after_s, const GoneRule& gone) {
  return now - std::max(m.last_seen, heard_since) <= lost_after_s && !gone.goneFor(m, now);
}

std::vector<Member> withoutAwaySpares(std::vector<Member> members, double now, double heard_since,
                                      double lost_after_s, const GoneRule& gone) {
  members.erase(std::remove_if(members.begin(), members.end(),
                               [&](const Member& m) {
                                 return m.state == MemberState::kSpare &&
                                        !heardLately(m, now, heard_since, lost_after_s, gone);
                               }),
                members.end());
  return members;
}

std::vector<LostNode> findLost(const std::vector<Member>& members,
                               const std::vector<std::string>& placed, double now,
                               double heard_since, double lost_after_s, const GoneRule& gone) {
  std::vector<LostNode> out;
  // By name, once: a search per placed node made each call placed x members long.
  std::unordered_map<std::string, const Member*> by_name;
  for (const Member& m : members) by_name.emplace(m.name, &m);  // the first of a name, as before
  for (const std::string& name : placed) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      out.push_back({name, "no member holds it", false});
      continue;
    }
    const Member& m = *it->second;
    switch (m.state) {
      case MemberState::kAssigned: {
        const double silent = now - std::max(m.last_seen, heard_since);
        if (silent > lost_after_s)
          out.push_back({name, "no heartbeat for " + secondsText(silent) + " s (--lost-after-s " +
                                   secondsText(lost_after_s) + ")",
                         true});
        else if (const std::optional<double> gone_for = gone.goneFor(m, now))
          out.push_back({name, "its connections to the coordinator closed " + secondsText(*gone_for) +
                                   " s ago and it sent nothing since (--gone-after-s " +
                                   secondsText(gone.gone_after_s) + "): its process ended",
                         true});
        break;
      }
      case MemberState::kLeft:
        out.push_back({name, "it said it leaves", false});
        break;
      case MemberState::kLost:
        out.push_back({name, "lost earlier, not replaced yet", false});
        break;
      default:
        break;  // done: its result is in; spare/joining: not a holder of a stage
    }
  }
  return out;
}

double probeRamGb(const Member& m) {
  const nlohmann::json probe = nlohmann::json::parse(m.probe_json, nullptr, /*allow_exceptions=*/false);
  if (!probe.is_object() || !probe.contains("ram_gb") || !probe["ram_gb"].is_number()) return 0;
  return probe["ram_gb"].get<double>();
}

double neededGb(const NodeSpec& node, const Member& lost) {
  return node.estimated_memory_bytes > 0 ? node.estimated_memory_bytes / 1e9 : probeRamGb(lost);
}

std::optional<Member> chooseSpare(const std::vector<Member>& members, double needed_gb) {
  for (const Member& m : members)
    if (m.state == MemberState::kSpare && probeRamGb(m) >= needed_gb) return m;
  return std::nullopt;
}

std::vector<std::string> dialOutOnlyPeersOf(const NodeSpec& node) {
  std::vector<std::string> names;
  for (const auto& [name, peer] : peersOf(node))  // by name, each once
    if (peer.dial_out_only) names.push_back(name);
  return names;
}

bool canHold(const Member& spare, const NodeSpec& node, bool relays_offered) {
  if (node.dial_out_only || !spare.dial_out_only) return true;
  return relays_offered || dialOutOnlyPeersOf(node).empty();
}

std::vector<Member> sparesFor(const std::vector<Member>& members, const NodeSpec& node,
                              bool relays_offered) {
  std::vector<Member> out;
  for (const Member& m : members)
    if (m.dial_out_only == node.dial_out_only) out.push_back(m);
  for (const Member& m : members)
    if (m.dial_out_only != node.dial_out_only && canHold(m, node, relays_offered)) out.push_back(m);
  return out;
}

std::string spareNote(const Member& spare, const std::vector<NodeSpec>& placed, bool relays_offered) {
  if (placed.empty()) return "";
  const double gives = probeRamGb(spare);
  // Three lists, at most 8 named each so the note stays short: the nodes it could take over, those
  // whose stage needs more RAM, and those that fit but that this volunteer cannot hold (canHold).
  struct Named {
    std::string text;
    int count = 0;
    void add(const std::string& item) {
      if (++count <= 8) text += (text.empty() ? "" : ", ") + item;
    }
    std::string str() const {
      return count > 8 ? text + " and " + std::to_string(count - 8) + " more" : text;
    }
  } fit, too_big, unlike;
  for (const NodeSpec& n : placed) {
    const std::string item = n.name + " " + gbText(n.estimated_memory_bytes / 1e9);
    if (n.estimated_memory_bytes / 1e9 > gives)
      too_big.add(item);
    else if (!canHold(spare, n, relays_offered))
      unlike.add(n.name);
    else
      fit.add(item);
  }
  const std::string why_unlike =
      "this volunteer joined as dial-out only, and so are peers of theirs, which it could reach "
      "only through a relay, and none is offered";
  if (fit.count == 0 && unlike.count == 0)
    return "no stage of the plan fits in the " + gbText(gives) + " this volunteer gives (each needs "
           "more, estimated: " + too_big.str() + "); it waits as a spare that cannot take a node over "
           "(give more with --memory-gb, or join a run of a smaller model)";
  if (fit.count == 0)
    return "no node of the plan can be taken over by this volunteer: " + unlike.str() +
           " fit in the " + gbText(gives) + " it gives, but " + why_unlike +
           (too_big.count ? "; the others need more (" + too_big.str() + ")" : std::string()) +
           "; it waits as a spare, and with the coordinator's --grow joins a new cluster";
  return "the run is planned; this volunteer waits as a spare: it takes over a node whose "
         "volunteer is lost or leaves if its stage fits in the " + gbText(gives) + " it gives (" +
         fit.str() + (too_big.count ? "; not " + too_big.str() : std::string()) + ")" +
         (unlike.count ? " and it can reach that node's peers (not " + unlike.str() + ": " +
                             why_unlike + ")"
                       : std::string()) +
         ", or, with the coordinator's --grow, joins a new cluster";
}

std::string tooSmallNote(const Member& spare, const std::string& node, double needed_gb) {
  return node + " needs a new holder, but its stage needs an estimated " + gbText(needed_gb) +
         " and this volunteer gives " + gbText(probeRamGb(spare)) + "; it stays a spare";
}

std::string unlikeReachNote(const NodeSpec& node) {
  const std::vector<std::string> names = dialOutOnlyPeersOf(node);
  std::string peers;
  for (size_t i = 0; i < names.size() && i < 8; ++i) peers += (i ? ", " : "") + names[i];
  if (names.size() > 8) peers += " and more";  // NodeHeaders keeps 9 of a node's ring members
  return node.name + " needs a new holder; this volunteer joined as dial-out only, so it would dial " +
         node.name + "'s peers, but " + peers + (names.size() == 1 ? " dials" : " dial") +
         " out only too, and a link between two such "
         "volunteers needs a relay, which nobody offers (a volunteer's `provider --join … --relay`, "
         "or the coordinator's --relay); it stays a spare";
}

std::optional<std::string> holderCannotComeBack(const Member& m, bool reachable, bool node_dial_out_only) {
  if (reachable || node_dial_out_only) return std::nullopt;
  return m.name + " holds a node placed as reachable at " + m.advertise +
         " and is now dial-out only; join as it was placed, or wait until a spare has taken the "
         "node over";
}

bool repointPeer(NodeSpec& node, const std::string& peer, const std::string& address,
                 const std::string& public_key) {
  bool changed = false;
  auto update = [&](PeerRef& ref) {
    if (ref.name != peer) return;
    ref.address = address;
    ref.public_key = public_key;
    changed = true;
  };
  if (node.upstream) update(*node.upstream);
  if (node.downstream) update(*node.downstream);
  for (RingSpec& ring : node.rings)
    for (PeerRef& member : ring.members) update(member);
  return changed;
}

ReplacementPlan planReplacement(const std::vector<NodeSpec>& placed, const std::string& lost_name,
                                const std::string& new_address, const std::string& new_public_key,
                                bool holder_dial_out_only, const std::vector<PeerRef::Relay>& relays) {
  ReplacementPlan plan;
  std::vector<NodeSpec> nodes = placed;
  const auto lost = std::find_if(nodes.begin(), nodes.end(),
                                 [&](const NodeSpec& n) { return n.name == lost_name; });
  if (lost == nodes.end()) CAIRN_THROW(BadInput, "the plan has no node ", lost_name, " to replace");
  // A node placed reachable taken by a dial-out-only volunteer: its links turn around (canHold).
  if (!lost->dial_out_only && holder_dial_out_only) {
    markDialOutOnly(nodes, {lost_name});
    plan.turned = true;
    plan.relayed = relayLinksOfNode(nodes, lost_name, relays);
  }
  // A node placed dial-out only keeps no address, whoever holds it: it listens on nothing and its
  // peers wait for it to dial them (or meet it at its relay), a reachable new holder too.
  const std::string address = lost->dial_out_only ? std::string() : new_address;
  for (const NodeSpec& node : nodes) {
    NodeSpec copy = node;
    if (node.name == lost_name) {
      copy.address = address;
      copy.extra["public_key"] = new_public_key;
      // Its own entry in its rings names it too.
      repointPeer(copy, lost_name, address, new_public_key);
      plan.taken_over = std::move(copy);
    } else if (repointPeer(copy, lost_name, address, new_public_key)) {
      plan.told.push_back(std::move(copy));
    }
  }
  std::sort(plan.told.begin(), plan.told.end(),
            [](const NodeSpec& a, const NodeSpec& b) { return a.name < b.name; });
  return plan;
}

std::string lostRowName(const std::string& name, const std::vector<Member>& members) {
  std::set<std::string> taken;
  for (const Member& m : members) taken.insert(m.name);
  for (int n = 1;; ++n) {
    std::string candidate = name + "-lost-" + std::to_string(n);
    if (!taken.count(candidate)) return candidate;
  }
}

bool isLostRowName(const std::string& name) {
  const size_t at = name.rfind("-lost-");
  if (at == std::string::npos || at == 0 || at + 6 >= name.size()) return false;
  return std::all_of(name.begin() + long(at) + 6, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Rejected notThisMember(const std::string& row, const std::string& claimed) {
  const std::string prefix = claimed + "-lost-";
  if (isLostRowName(row) && row.size() > prefix.size() && row.compare(0, prefix.size(), prefix) == 0)
    return {claimed + " was given to another volunteer while this one was unreachable; it is not this "
            "volunteer's node any more (join again without its name to be a spare)",
            /*node_taken=*/true};
  return {"you are not " + claimed + ": join first", /*node_taken=*/false};
}

}  // namespace cairn::coordinator
