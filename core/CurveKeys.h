// CURVE key pairs and secret key files, shared by clusterize (which makes one pair per node and
// writes node_data) and provider (which reads its own). Pure functions; any thread.
// The ZAP handler and socket options live in node/transport/CurveSecurity.h.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cairn {

struct NodeSpec;

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; never leaves the node's own folder
};

CurveKeyPair generateCurveKeyPair();
bool isZ85Key(const std::string& key);

// A secret key file holds two lines, "public <key>" and "secret <key>", with mode 0600.
// Writing creates it with 0600 (atomically); reading refuses a file others can read (BadInput
// naming the file and its mode) and a malformed one.
void writeKeyFile(const std::string& path, const CurveKeyPair& keys);
CurveKeyPair readKeyFile(const std::string& path);

// The file name of a node's secret key inside its node folder.
constexpr const char* kSecretKeyFile = "secret.key";

// Gives every node of a plan a fresh key pair: fills the public_key of every PeerRef that names a
// node of `nodes` (upstream, downstream, ring members) and extra.public_key of the node itself.
// Returns node name → its key pair (the caller writes each secret into that node's folder only).
std::map<std::string, CurveKeyPair> assignCurveKeys(std::vector<NodeSpec>& nodes);

// The same for keys the nodes made themselves (volunteers that joined a coordinator): fills every
// PeerRef naming a node of `public_keys` and extra.public_key. BadInput naming the node when a
// placed node has no key in the map.
void applyPublicKeys(std::vector<NodeSpec>& nodes, const std::map<std::string, std::string>& public_keys);

}  // namespace cairn
