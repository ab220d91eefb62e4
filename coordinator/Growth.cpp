#include "coordinator/Growth.h"

#include <algorithm>
#include <numeric>
#include <set>

#include <nlohmann/json.hpp>

#include "coordinator/DialOutPlacement.h"
#include "core/Error.h"

namespace cairn::coordinator {

double probedRamGb(const Member& m) {
  const nlohmann::json probe =
      nlohmann::json::parse(m.probe_json, nullptr, /*allow_exceptions=*/false);
  if (!probe.is_object() || !probe.contains("ram_gb") || !probe["ram_gb"].is_number()) return 0;
  return probe["ram_gb"].get<double>();
}

std::optional<std::vector<Member>> chooseGrowth(const std::vector<Member>& members,
                                                const std::vector<double>& stage_ram_gb,
                                                int keep_spares) {
  if (stage_ram_gb.empty()) return std::nullopt;
  std::vector<const Member*> spares;
  for (const Member& m : members)
    if (m.state == MemberState::kSpare) spares.push_back(&m);
  if (spares.size() < stage_ram_gb.size() + size_t(std::max(keep_spares, 0))) return std::nullopt;
  std::vector<size_t> order(stage_ram_gb.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return stage_ram_gb[a] > stage_ram_gb[b]; });
  std::vector<bool> taken(spares.size(), false);
  std::vector<Member> chosen(stage_ram_gb.size());
  for (size_t s : order) {
    bool found = false;
    for (size_t i = 0; i < spares.size() && !found; ++i) {
      if (taken[i] || probedRamGb(*spares[i]) < stage_ram_gb[s]) continue;
      taken[i] = true;
      chosen[s] = *spares[i];
      found = true;
    }
    if (!found) return std::nullopt;
  }
  return chosen;
}

bool needsRelay(const std::vector<NodeSpec>& nodes, const std::vector<Member>& spares) {
  for (size_t s = 0; s < spares.size(); ++s) {
    if (!spares[s].dial_out_only) continue;
    if (s + 1 < spares.size() && spares[s + 1].dial_out_only) return true;
    for (const NodeSpec& n : nodes)
      if (n.stage == int(s) && n.dial_out_only) return true;  // its ring peer in another cluster
  }
  return false;
}

std::optional<std::vector<Member>> chooseLinkableGrowth(const std::vector<Member>& members,
                                                        const std::vector<double>& stage_ram_gb,
                                                        int keep_spares, const std::vector<NodeSpec>& nodes,
                                                        bool relays_offered) {
  // chooseGrowth takes, stage by stage, the first qualifying spare in this order: a dial-out-only
  // one only where no reachable one is left that qualifies, so the reachable spares alone could
  // not form the cluster either when this choice needs a relay.
  std::vector<Member> ordered;
  for (const bool behind : {false, true})
    for (const Member& m : members)
      if ((m.dial_out_only && m.state == MemberState::kSpare) == behind) ordered.push_back(m);
  auto chosen = chooseGrowth(ordered, stage_ram_gb, keep_spares);
  if (chosen && !relays_offered && needsRelay(nodes, *chosen)) chosen.reset();
  return chosen;
}

GrowthPlan planGrowth(const std::vector<NodeSpec>& nodes, const std::vector<Member>& spares,
                      int new_cluster, const std::vector<PeerRef::Relay>& relays) {
  const int stages = int(spares.size());
  std::vector<const NodeSpec*> templates(size_t(stages), nullptr);
  for (const NodeSpec& n : nodes) {
    if (n.cluster == new_cluster)
      CAIRN_THROW(BadInput, "growth: cluster ", new_cluster, " already has node ", n.name);
    if (n.num_stages != stages)
      CAIRN_THROW(BadInput, "growth: node ", n.name, " is one of ", n.num_stages,
                  " stages but ", stages, " spares were chosen");
    if (n.stage < 0 || n.stage >= stages)
      CAIRN_THROW(BadInput, "growth: node ", n.name, " holds stage ", n.stage, " of ", stages);
    const NodeSpec*& t = templates[size_t(n.stage)];
    if (!t || n.cluster < t->cluster) t = &n;
  }
  auto ref = [](const Member& m) { return PeerRef{m.name, m.advertise, m.public_key}; };
  GrowthPlan plan;
  for (int s = 0; s < stages; ++s) {
    if (!templates[size_t(s)]) CAIRN_THROW(BadInput, "growth: no placed node holds stage ", s);
    NodeSpec n = *templates[size_t(s)];
    n.name = spares[size_t(s)].name;
    n.address = spares[size_t(s)].advertise;
    // A reachable spare's node listens, whatever its template's holder was (a dial-out-only
    // spare's is marked below).
    n.dial_out_only = false;
    n.cluster = new_cluster;
    if (n.upstream) n.upstream = ref(spares[size_t(s - 1)]);
    if (n.downstream) n.downstream = ref(spares[size_t(s + 1)]);
    for (RingSpec& ring : n.rings) {
      // A ring member the template reached through a relay (both dial-out only) dials the new,
      // reachable node directly (node/transport/ReversedLinks.h): the relay was the template's.
      for (PeerRef& member : ring.members) member.relay.reset();
      ring.members.push_back(ref(spares[size_t(s)]));
      ring.rank = int(ring.members.size()) - 1;
    }
    plan.added.push_back(std::move(n));
  }
  for (const NodeSpec& existing : nodes) {
    NodeSpec told = existing;
    bool changed = false;
    for (RingSpec& ring : told.rings) {
      ring.members.push_back(ref(spares[size_t(existing.stage)]));
      changed = true;
    }
    if (changed) plan.told.push_back(std::move(told));
  }
  std::set<std::string> behind;
  for (const Member& m : spares)
    if (m.dial_out_only) behind.insert(m.name);
  if (behind.empty()) return plan;
  // The dial-out-only spares' nodes: no address wherever they are named, and a relay for each of
  // their links to a dial-out-only node (the existing ones keep theirs).
  std::vector<NodeSpec> all = plan.told;
  all.insert(all.end(), plan.added.begin(), plan.added.end());
  markDialOutOnly(all, behind);
  for (const std::string& name : behind) relayLinksOfNode(all, name, relays);
  plan.told.assign(all.begin(), all.begin() + long(plan.told.size()));
  plan.added.assign(all.begin() + long(plan.told.size()), all.end());
  return plan;
}

std::vector<DealEntry> grownDeal(const std::vector<DealEntry>& deal,
                                 int64_t newest_reported_epoch) {
  validateDeal(deal, "deal");
  std::vector<DealEntry> grown = deal;
  const int64_t from = std::max<int64_t>({newest_reported_epoch + 1, int64_t(1),
                                          deal.back().from_epoch + 1});
  grown.push_back({from, deal.back().clusters + 1});
  return grown;
}

std::string dealJson(const std::vector<DealEntry>& deal) { return dealToJson(deal).dump(); }

std::vector<DealEntry> parseDeal(const std::string& json, const std::string& where) {
  return dealFromJson(nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false),
                      where + ": deal");
}

std::vector<DealEntry> loadDeal(const CoordinatorStore& store, int planned_clusters) {
  const std::optional<std::string> text = store.meta("deal");
  if (!text) return {{0, planned_clusters}};
  return parseDeal(*text, "coordinator.db meta \"deal\"");
}

void saveDeal(CoordinatorStore& store, const std::vector<DealEntry>& deal) {
  validateDeal(deal, "deal");
  store.setMeta("deal", dealJson(deal));
}

std::vector<std::vector<DealEntry>> servedDeals(const CoordinatorStore& store) {
  std::vector<std::vector<DealEntry>> deals{loadDeal(store, std::stoi(store.meta("num_clusters").value_or("1")))};
  if (const auto text = store.meta("growth")) {
    const nlohmann::json g = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (g.is_object() && g.contains("deal"))
      deals.push_back(parseDeal(g["deal"].dump(), "coordinator.db meta \"growth\""));
  }
  return deals;
}

std::vector<std::string> proposedGrowthNodes(const CoordinatorStore& store) {
  const auto text = store.meta("growth");
  if (!text) return {};
  const nlohmann::json g = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!g.is_object() || g.value("state", "") != "proposed" || !g.contains("spares") ||
      !g["spares"].is_array())
    return {};
  std::vector<std::string> nodes;
  for (const auto& n : g["spares"])
    if (n.is_string()) nodes.push_back(n.get<std::string>());
  return nodes;
}

}  // namespace cairn::coordinator
