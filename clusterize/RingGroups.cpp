#include "clusterize/RingGroups.h"

#include <map>

#include "core/Error.h"

namespace cairn::clusterize {

std::vector<RingGroup> groupRings(const std::vector<std::string>& parameters,
                                  const std::vector<std::vector<std::string>>& holder_of) {
  std::vector<RingGroup> groups;
  std::map<std::vector<std::string>, size_t> index;
  for (size_t p = 0; p < parameters.size(); ++p) {
    std::vector<std::string> holders;
    for (const auto& cluster : holder_of) {
      CAIRN_ENFORCE(p < cluster.size() && !cluster[p].empty(), "parameter ", parameters[p],
                    " has no holder in some cluster");
      holders.push_back(cluster[p]);
    }
    auto [it, added] = index.emplace(holders, groups.size());
    if (added) groups.push_back({"ring_" + std::to_string(groups.size()), {}, holders});
    groups[it->second].parameters.push_back(parameters[p]);
  }
  return groups;
}

}  // namespace cairn::clusterize
