// CoordinatorStore::placedNames, apart from the SQL (CoordinatorStore.cpp): the plan's node names
// as meta "placed" keeps them, for the rooms that read the plan (replacement, the relay).
#include <nlohmann/json.hpp>

#include "coordinator/CoordinatorStore.h"

namespace cairn::coordinator {

std::vector<std::string> CoordinatorStore::placedNames() const {
  const auto placed = nlohmann::json::parse(meta("placed").value_or("[]"), nullptr, false);
  std::vector<std::string> names;
  if (!placed.is_array()) return names;
  for (const auto& n : placed)
    if (n.is_string()) names.push_back(n.get<std::string>());
  return names;
}

}  // namespace cairn::coordinator
