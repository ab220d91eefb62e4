// The replacement tests' plans and members (ReplacementTest.cpp, MemberReplacerTest.cpp): a
// member row, one real CURVE key per node name, and the 2 clusters x 3 stages plan whose stage s
// of both clusters share ring_s.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "core/CurveKeys.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"

namespace cairn::coordinator::testing {

inline Member replacementMember(const std::string& name, MemberState state, double last_seen, double ram_gb = 8,
                                double joined_at = 0) {
  Member m;
  m.name = name;
  m.public_key = generateCurveKeyPair().public_key;
  m.advertise = "127.0.0.1:" + std::to_string(7000 + std::stoi(name.substr(5)));
  m.probe_json = nlohmann::json{{"ram_gb", ram_gb}, {"cores", 4}, {"compute_gflops", 50},
                                {"bandwidth_mbps", 1000}}
                     .dump();
  m.state = state;
  m.joined_at = joined_at;
  m.last_seen = last_seen;
  return m;
}

// One real key pair per node name (node.json files must hold Z85 CURVE keys).
inline std::string keyOf(const std::string& name) {
  static std::map<std::string, std::string> keys;
  auto it = keys.find(name);
  if (it == keys.end()) it = keys.emplace(name, generateCurveKeyPair().public_key).first;
  return it->second;
}

inline PeerRef peerRef(const std::string& name) {
  return {name, "10.0.0." + name.substr(5) + ":5000", keyOf(name)};
}

// 2 clusters x 3 stages: cluster c holds node_{3c}, node_{3c+1}, node_{3c+2}; stage s of both
// clusters share one ring.
inline std::vector<NodeSpec> twoByThree() {
  std::vector<NodeSpec> nodes;
  for (int c = 0; c < 2; ++c)
    for (int s = 0; s < 3; ++s) {
      NodeSpec n;
      n.name = "node_" + std::to_string(3 * c + s);
      n.job_id = "job";
      n.address = peerRef(n.name).address;
      n.cluster = c;
      n.stage = s;
      n.num_stages = 3;
      n.role = s == 0 ? StageRole::kRoot : s == 2 ? StageRole::kLeaf : StageRole::kStem;
      if (s > 0) n.upstream = peerRef("node_" + std::to_string(3 * c + s - 1));
      if (s < 2) n.downstream = peerRef("node_" + std::to_string(3 * c + s + 1));
      RingSpec ring;
      ring.id = "ring_" + std::to_string(s);
      ring.members = {peerRef("node_" + std::to_string(s)), peerRef("node_" + std::to_string(3 + s))};
      ring.rank = c;
      n.rings = {ring};
      n.inputs = {{"x", "tensor", "float32", {1, 4}}};
      n.outputs = {{"y", "tensor", "float32", {1, 4}}};
      n.extra["public_key"] = keyOf(n.name);
      n.extra["num_clusters"] = 2;
      nodes.push_back(n);
    }
  return nodes;
}

}  // namespace cairn::coordinator::testing
