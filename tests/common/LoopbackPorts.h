// Loopback ports for tests that need real tcp endpoints: every test file takes them from here, so
// that test processes running at once (ctest -j) never pick the same port. The kernel hands out
// the ports: each is bound (port 0) while the others are picked, so one call never returns a port
// twice, and a port in use by another process is never returned. The sockets are closed before
// returning, so there is a short window in which another process could take a port (the kernel
// hands ephemeral ports out in turn, so a just-returned one is not handed out again soon).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace cairn::testutil {

inline std::vector<int> freeLoopbackPorts(int count) {
  std::vector<int> ports, fds;
  for (int i = 0; i < count; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("freeLoopbackPorts: socket() failed");
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      for (int open : fds) ::close(open);
      throw std::runtime_error("freeLoopbackPorts: cannot bind a loopback port");
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

// "127.0.0.1:<port>" and "tcp://127.0.0.1:<port>" for each of `count` free ports.
inline std::vector<std::string> freeLoopbackAddresses(int count) {
  std::vector<std::string> out;
  for (int port : freeLoopbackPorts(count)) out.push_back("127.0.0.1:" + std::to_string(port));
  return out;
}
inline std::vector<std::string> freeTcpEndpoints(int count) {
  std::vector<std::string> out;
  for (const auto& address : freeLoopbackAddresses(count)) out.push_back("tcp://" + address);
  return out;
}

}  // namespace cairn::testutil
