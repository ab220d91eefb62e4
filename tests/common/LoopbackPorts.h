// Loopback ports for tests that need real tcp endpoints: every test file takes them from here, so
// that test processes running at once (ctest -j) never pick the same port.
//
// The ports lie below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range): the
// kernel never hands such a port out for another process's bind to port 0 or outgoing connection,
// so a port returned here stays free while the test's own process is down between a kill and a
// restart. Test processes share them out in blocks of kPortBlock ports: a process claims a block
// by writing its pid (and the pid's start time) into /tmp/cairn-loopback-ports/block-K under an
// flock, and the block is its own until that process is gone. A process hands out every other port
// of its blocks, once, and keeps the one above each free (a volunteer on --listen's port P takes
// P + 1), each checked by binding it. Drawing single ports at random instead (as before)
// let two tests collide: CI once saw a coordinator's restart fail with "Address already in use"
// because a test beside it had drawn the port while that coordinator was down.
// The same claims are made by tools/bench/loopback_ports.py (the python tests and benchmarks), so
// the C++ and python tests share one scheme. No library here does this; it is written by hand.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cairn::testutil {

inline constexpr int kPortBlock = 64;
inline constexpr int kLowestPort = 20000;
inline constexpr const char* kPortClaims = "/tmp/cairn-loopback-ports";

// The lowest port the kernel hands out on its own (32768 if the file cannot be read).
inline int ephemeralPortLow() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  if (!(range >> low) || low <= kLowestPort + kPortBlock) low = 32768;
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

// "<pid> <start time>" of a live process, "" when it is gone (the start time, field 22 of
// /proc/<pid>/stat, tells a reused pid from the claimant).
inline std::string processIdentity(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return "";
  const auto close = line.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (fields >> field); ++i) {
    if (i == 22) return std::to_string(pid) + " " + field;
  }
  return "";
}

// Claims block `k` for this process if no live process holds it.
inline bool claimPortBlock(int k) {
  if (::mkdir(kPortClaims, 01777) == 0) ::chmod(kPortClaims, 01777);  // the umask aside: every user's tests
  const std::string path = std::string(kPortClaims) + "/block-" + std::to_string(k);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return false;  // another user's file: not ours to take
  ::fchmod(fd, 0666);
  bool claimed = false;
  if (::flock(fd, LOCK_EX) == 0) {  // held only for this read and write
    char text[64] = {};
    const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
    std::istringstream owner(std::string(text, n > 0 ? size_t(n) : 0));
    long pid = 0;
    std::string start;
    const bool held = (owner >> pid >> start) && processIdentity(pid) == std::to_string(pid) + " " + start;
    if (!held) {
      const std::string me = processIdentity(::getpid()) + "\n";
      claimed = ::ftruncate(fd, 0) == 0 && ::pwrite(fd, me.data(), me.size(), 0) == ssize_t(me.size());
    }
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return claimed;
}

// `count` distinct ports on 127.0.0.1, free now, that no other process gets from here while this
// one lives; the port above each is free and kept so too.
inline std::vector<int> freeLoopbackPorts(int count) {
  static std::mutex guard;
  static long owner = 0;  // a forked child starts its own blocks
  static int next = 0, end = 0;
  std::lock_guard<std::mutex> lock(guard);
  if (owner != ::getpid()) owner = ::getpid(), next = end = 0;
  const int blocks = (ephemeralPortLow() - kLowestPort) / kPortBlock;
  std::vector<int> ports;
  std::mt19937 draw(std::random_device{}());
  while (static_cast<int>(ports.size()) < count) {
    if (next == end) {
      const int first = std::uniform_int_distribution<int>(0, blocks - 1)(draw);
      int k = 0;
      while (k < blocks && !claimPortBlock((first + k) % blocks)) ++k;
      if (k == blocks) throw std::runtime_error(std::string("freeLoopbackPorts: every block of loopback ports below the ephemeral range is held (") + kPortClaims + ")");
      next = kLowestPort + ((first + k) % blocks) * kPortBlock, end = next + kPortBlock;
    }
    // Every other port: the one above stays free as well, since a volunteer takes --listen's port
    // + 1 for the peers behind routers (node/transport/ReversedLinks.h).
    const int port = next;
    next += 2;
    if (loopbackPortBinds(port) && loopbackPortBinds(port + 1)) ports.push_back(port);
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
