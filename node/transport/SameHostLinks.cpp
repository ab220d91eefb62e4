#include "node/transport/SameHostLinks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "core/Log.h"
#include "core/NodeConfigs.h"

namespace cairn {
namespace {

// "tcp://HOST:PORT" → {HOST, PORT}; nullopt for other transports or without a numeric port.
std::optional<std::pair<std::string, std::string>> tcpHostPort(const std::string& endpoint) {
  const std::string prefix = "tcp://";
  if (endpoint.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < prefix.size()) return std::nullopt;
  std::string host = endpoint.substr(prefix.size(), colon - prefix.size());
  std::string port = endpoint.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return std::make_pair(host, port);
}

}  // namespace

bool isLoopbackTcpEndpoint(const std::string& endpoint) {
  const auto hp = tcpHostPort(endpoint);
  return hp && isLoopbackName(hp->first);
}

std::string sameHostDir(const std::string& path) {
  const std::string dir = path.empty() ? "/tmp/cairn-" + std::to_string(getuid()) : path;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    CAIRN_WARN("same-host links off: cannot create ", dir, ": ", std::strerror(errno),
               "; nodes on this host talk over TCP");
    return "";
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
      (st.st_mode & 077) != 0) {
    CAIRN_WARN("same-host links off: ", dir, " is not a directory of this user with mode 0700 "
               "(a symlink, another user's, or open to others); nodes on this host talk over TCP");
    return "";
  }
  return dir;
}

std::string sameHostSocket(const std::string& dir, const std::string& tcp_endpoint) {
  if (dir.empty() || !isLoopbackTcpEndpoint(tcp_endpoint)) return "";
  return "ipc://" + dir + "/" + tcpHostPort(tcp_endpoint)->second;
}

}  // namespace cairn
