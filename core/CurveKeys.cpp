#include "core/CurveKeys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <zmq.h>

#include "core/Error.h"
#include "core/NodeData.h"

namespace cairn {

CurveKeyPair generateCurveKeyPair() {
  char public_key[41], secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0)
    CAIRN_THROW(InternalError, "this libzmq cannot make CURVE keys (built without libsodium?)");
  return {public_key, secret_key};
}

bool isZ85Key(const std::string& key) {
  if (key.size() != 40) return false;
  static const std::string alphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  return key.find_first_not_of(alphabet) == std::string::npos;
}

void writeKeyFile(const std::string& path, const CurveKeyPair& keys) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) CAIRN_THROW(BadInput, path, ": cannot create the key file");
  ::fchmod(fd, 0600);  // whatever the umask
  const std::string text = "public " + keys.public_key + "\nsecret " + keys.secret_key + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    CAIRN_THROW(BadInput, path, ": cannot write the key file");
  }
}

CurveKeyPair readKeyFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    CAIRN_THROW(BadInput, path, ": cannot open the key file (run clusterize, or use --insecure for local debugging)");
  if (st.st_mode & 0077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 0777);
    CAIRN_THROW(BadInput, path, ": secret key file has mode ", mode,
                "; it must be readable by its owner only (chmod 600 ", path, ")");
  }
  std::ifstream in(path);
  CurveKeyPair keys;
  std::string word;
  while (in >> word) {
    std::string value;
    in >> value;
    if (word == "public") keys.public_key = value;
    else if (word == "secret") keys.secret_key = value;
  }
  if (!isZ85Key(keys.public_key) || !isZ85Key(keys.secret_key))
    CAIRN_THROW(BadInput, path, ": expected lines \"public <40-char Z85 key>\" and \"secret <key>\"");
  return keys;
}

std::map<std::string, CurveKeyPair> assignCurveKeys(std::vector<NodeSpec>& nodes) {
  std::map<std::string, CurveKeyPair> keys;
  for (const NodeSpec& node : nodes) keys[node.name] = generateCurveKeyPair();
  auto fill = [&](PeerRef& peer) {
    auto it = keys.find(peer.name);
    if (it != keys.end()) peer.public_key = it->second.public_key;
  };
  for (NodeSpec& node : nodes) {
    if (node.upstream) fill(*node.upstream);
    if (node.downstream) fill(*node.downstream);
    for (RingSpec& ring : node.rings)
      for (PeerRef& member : ring.members) fill(member);
    node.extra["public_key"] = keys[node.name].public_key;
  }
  return keys;
}

void applyPublicKeys(std::vector<NodeSpec>& nodes, const std::map<std::string, std::string>& public_keys) {
  for (const NodeSpec& node : nodes)
    if (!public_keys.count(node.name))
      CAIRN_THROW(BadInput, "node ", node.name, " is placed but has no public key");
  auto fill = [&](PeerRef& peer) {
    auto it = public_keys.find(peer.name);
    if (it != public_keys.end()) peer.public_key = it->second;
  };
  for (NodeSpec& node : nodes) {
    if (node.upstream) fill(*node.upstream);
    if (node.downstream) fill(*node.downstream);
    for (RingSpec& ring : node.rings)
      for (PeerRef& member : ring.members) fill(member);
    node.extra["public_key"] = public_keys.at(node.name);
  }
}

}  // namespace cairn
