// Loopback ports for tests that need real tcp endpoints: every test file takes them from here, so
// that test processes running at once (ctest -j) never pick the same port. The ports are drawn at
// random from below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range) and
// each is checked by binding it: the kernel never hands such a port out for another process's
// bind to port 0 or outgoing connection, so a port returned here stays free while the test's own
// process is down between a kill and a restart (a port from the kernel's range did not: another
// test running beside it could be handed it in between). Two test processes drawing the same
// port at the same moment is the one collision left: 1 in ~12,000 per port. Same policy as
// tests/integration/volunteer_harness.py's free_ports and tools/bench/loopback_ports.py.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace cairn::testutil {

// The lowest port the kernel hands out on its own (32768 if the file cannot be read).
inline int ephemeralPortLow() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  if (!(range >> low) || low <= 20001) low = 32768;
  return low;
}

inline bool loopbackPortBinds(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("freeLoopbackPorts: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

inline std::vector<int> freeLoopbackPorts(int count) {
  std::mt19937 draw(std::random_device{}());
  std::uniform_int_distribution<int> pick(20000, ephemeralPortLow() - 1);
  std::vector<int> ports;
  for (int tries = 0; static_cast<int>(ports.size()) < count; ++tries) {
    if (tries > 10000) throw std::runtime_error("freeLoopbackPorts: no free loopback port below the ephemeral range");
    const int port = pick(draw);
    if (std::find(ports.begin(), ports.end(), port) == ports.end() && loopbackPortBinds(port)) ports.push_back(port);
  }
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
