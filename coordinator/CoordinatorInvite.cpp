#include "coordinator/CoordinatorInvite.h"

#include <filesystem>
#include <fstream>

#include "coordinator/JoinPolicy.h"
#include "core/Error.h"
#include "core/NodeConfigs.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

CurveKeyPair loadOrMakeCoordinatorKeys(const std::string& out) {
  const std::string key_path = out + "/coordinator.key";
  if (std::filesystem::exists(key_path)) return readKeyFile(key_path);
  CurveKeyPair keys = generateCurveKeyPair();
  writeKeyFile(key_path, keys);
  return keys;
}

std::string chooseToken(CoordinatorStore& store, const std::string& option) {
  std::string token;
  if (!option.empty()) {
    if (option.size() < 32 || option.size() > 128 ||
        option.find_first_not_of("0123456789abcdef") != std::string::npos)
      CAIRN_THROW(BadInput, "--token must be 32 to 128 lowercase hex digits");
    token = option;
  } else {
    token = store.meta("token").value_or(randomHex(16));
  }
  store.setMeta("token", token);
  return token;
}

std::string formInvite(const std::string& bound, const std::string& advertise,
                       const std::string& listen, const std::string& public_key,
                       const std::string& token, const std::string& invite_file) {
  std::string bound_host, advertise_host;
  int bound_port = 0, advertise_port = 0;
  parseHostPort(bound, "coordinator", "bound address", &bound_host, &bound_port);
  if (!advertise.empty()) {
    parseHostPort(advertise, "command line", "--advertise", &advertise_host, &advertise_port);
  } else {
    advertise_host = bound_host;
    advertise_port = bound_port;
    if (advertise_host == "0.0.0.0")
      CAIRN_THROW(BadInput, "--serve ", listen,
                  " listens on every interface: give --advertise HOST:PORT, the address "
                  "volunteers dial");
  }
  const std::string invite = formatInvite(Invite{advertise_host, advertise_port, public_key, token});
  if (!invite_file.empty()) {
    std::ofstream f(invite_file + ".tmp");
    f << invite << "\n";
    f.close();
    std::filesystem::rename(invite_file + ".tmp", invite_file);
  }
  return invite;
}

}  // namespace cairn::coordinator
