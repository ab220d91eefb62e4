// NodeSecurity: what a provider needs to run its transport with CurveZMQ, taken from its node.json
// (the public keys of its pipeline neighbours and ring peers) and its secret.key file.
// Pure functions; any thread.
#pragma once

#include <map>
#include <string>

#include "core/NodeData.h"
#include "node/transport/ZmqTransport.h"

namespace cairn {

// The node's own key pair (from `secret_key_path`) and the public key of every peer it talks to:
// upstream, downstream and every ring member but itself. BadInput naming `spec_path` and the peer
// when a peer has no public key (a plan written without keys: re-run clusterize or cairn_keys, or
// use --insecure), and when the key file's public key differs from node.json's extra.public_key.
CurveOptions curveOptionsForNode(const NodeSpec& node, const std::string& spec_path,
                                 const std::string& secret_key_path);

// public key → peer name, the list a ZapAuthenticator admits.
std::map<std::string, std::string> admittedKeys(const CurveOptions& curve);

}  // namespace cairn
