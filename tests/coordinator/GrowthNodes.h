// The Growth and Grower tests' members and plan (GrowthTest.cpp, GrowerTest.cpp): a member with a
// RAM figure, and two clusters x two stages as planVolunteers writes them.
#pragma once

#include <string>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "core/NodeData.h"

namespace cairn::coordinator::testing {

inline Member growthMember(const std::string& name, MemberState state, double ram) {
  Member m;
  m.name = name;
  m.state = state;
  m.probe_json = "{\"ram_gb\":" + std::to_string(ram) + ",\"cores\":2}";
  return m;
}

// Two clusters x two stages, as planVolunteers writes them: ring_s joins stage s of each cluster.
inline std::vector<NodeSpec> twoByTwo() {
  std::vector<NodeSpec> nodes;
  for (int c = 0; c < 2; ++c)
    for (int s = 0; s < 2; ++s) {
      NodeSpec n;
      n.name = "node_" + std::to_string(c * 2 + s);
      n.address = "127.0.0.1:" + std::to_string(5000 + c * 2 + s);
      n.cluster = c;
      n.stage = s;
      n.num_stages = 2;
      n.stage_file = "stage_" + std::to_string(s) + ".pt";
      n.parameters = {"p" + std::to_string(s)};
      if (s == 1) n.upstream = PeerRef{"node_" + std::to_string(c * 2), "", "k"};
      if (s == 0) n.downstream = PeerRef{"node_" + std::to_string(c * 2 + 1), "", "k"};
      RingSpec ring;
      ring.id = "ring_" + std::to_string(s);
      ring.parameters = n.parameters;
      for (int o = 0; o < 2; ++o) ring.members.push_back({"node_" + std::to_string(o * 2 + s), "a", "k"});
      ring.rank = c;
      n.rings.push_back(ring);
      nodes.push_back(n);
    }
  return nodes;
}

}  // namespace cairn::coordinator::testing
