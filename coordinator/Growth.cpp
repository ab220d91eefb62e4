#include "coordinator/Growth.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

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

}  // namespace cairn::coordinator
