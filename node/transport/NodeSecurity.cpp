#include "node/transport/NodeSecurity.h"

#include "core/Error.h"

namespace cairn {

CurveOptions curveOptionsForNode(const NodeSpec& node, const std::string& spec_path,
                                 const std::string& secret_key_path) {
  CurveOptions curve;
  curve.own = readKeyFile(secret_key_path);
  if (node.extra.contains("public_key") && node.extra["public_key"].is_string() &&
      node.extra["public_key"].get<std::string>() != curve.own.public_key)
    CAIRN_THROW(BadInput, secret_key_path, ": its public key differs from ", spec_path,
                " extra.public_key (keys from another clusterize run? copy the node folder again)");
  auto add = [&](const PeerRef& peer, const std::string& where) {
    if (peer.name == node.name) return;
    if (!isZ85Key(peer.public_key))
      CAIRN_THROW(BadInput, spec_path, ": ", where, " peer ", peer.name,
                  " has no CURVE public_key (plan written without keys: re-run clusterize or "
                  "cairn_keys, or run provider --insecure for local debugging)");
    auto [it, inserted] = curve.peer_public_keys.emplace(peer.name, peer.public_key);
    if (!inserted && it->second != peer.public_key)
      CAIRN_THROW(BadInput, spec_path, ": peer ", peer.name, " is listed with two public keys");
  };
  if (node.upstream) add(*node.upstream, "upstream");
  if (node.downstream) add(*node.downstream, "downstream");
  for (const RingSpec& ring : node.rings)
    for (const PeerRef& member : ring.members) add(member, "rings." + ring.id);
  return curve;
}

std::map<std::string, std::string> admittedKeys(const CurveOptions& curve) {
  std::map<std::string, std::string> admitted;
  for (const auto& [name, key] : curve.peer_public_keys) admitted.emplace(key, name);
  return admitted;
}

}  // namespace cairn
