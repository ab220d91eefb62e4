#include "coordinator/Replacement.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "core/Error.h"

namespace cairn::coordinator {
namespace {

double probeRam(const Member& m) {
  const nlohmann::json probe = nlohmann::json::parse(m.probe_json, nullptr, /*allow_exceptions=*/false);
  if (!probe.is_object() || !probe.contains("ram_gb") || !probe["ram_gb"].is_number()) return 0;
  return probe["ram_gb"].get<double>();
}

std::string secondsText(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", s);
  return text;
}

}  // namespace

std::vector<LostNode> findLost(const std::vector<Member>& members,
                               const std::vector<std::string>& placed, double now,
                               double heard_since, double lost_after_s) {
  std::vector<LostNode> out;
  for (const std::string& name : placed) {
    const auto it = std::find_if(members.begin(), members.end(),
                                 [&](const Member& m) { return m.name == name; });
    if (it == members.end()) {
      out.push_back({name, "no member holds it", false});
      continue;
    }
    const Member& m = *it;
    switch (m.state) {
      case MemberState::kAssigned: {
        const double silent = now - std::max(m.last_seen, heard_since);
        if (silent > lost_after_s)
          out.push_back({name, "no heartbeat for " + secondsText(silent) + " s (--lost-after-s " +
                                   secondsText(lost_after_s) + ")",
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

std::optional<Member> chooseSpare(const std::vector<Member>& members, const Member& lost) {
  const double needed = probeRam(lost);
  for (const Member& m : members)
    if (m.state == MemberState::kSpare && probeRam(m) >= needed) return m;
  return std::nullopt;
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

ReplacementPlan planReplacement(const std::vector<NodeSpec>& nodes, const std::string& lost_name,
                                const std::string& new_address, const std::string& new_public_key) {
  ReplacementPlan plan;
  bool found = false;
  for (const NodeSpec& node : nodes) {
    NodeSpec copy = node;
    if (node.name == lost_name) {
      copy.address = new_address;
      copy.extra["public_key"] = new_public_key;
      // Its own entry in its rings names it too.
      repointPeer(copy, lost_name, new_address, new_public_key);
      plan.taken_over = std::move(copy);
      found = true;
    } else if (repointPeer(copy, lost_name, new_address, new_public_key)) {
      plan.told.push_back(std::move(copy));
    }
  }
  if (!found) CAIRN_THROW(BadInput, "the plan has no node ", lost_name, " to replace");
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

}  // namespace cairn::coordinator
