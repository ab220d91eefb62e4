// RingGroups: which node holds each parameter in each cluster, and the groups of parameters that
// have the same holders everywhere (Ravnest's "ring IDs"). node/RingClusterSync runs one ring all-reduce per group
// among its holders; clusters may be cut differently, so one node can be in several groups.
// Pure function; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace cairn::clusterize {

struct RingGroup {
  std::string id;                       // "ring_0", numbered by first parameter in model order
  std::vector<std::string> parameters;  // in model order
  std::vector<std::string> holders;     // the holding node per cluster (cluster order)
};

// holder_of[c][p] = name of the node holding parameter p (index into `parameters`) in cluster c.
// Every parameter must have a holder in every cluster.
std::vector<RingGroup> groupRings(const std::vector<std::string>& parameters,
                                  const std::vector<std::vector<std::string>>& holder_of);

}  // namespace cairn::clusterize
