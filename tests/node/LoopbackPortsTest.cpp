// The tests' loopback ports (tests/common/LoopbackPorts.h): processes running at once never get the
// same port (nor one the port above another), the C++ tests and the python ones
// (tools/bench/loopback_ports.py) share one scheme, and a block is taken over once its claimant is
// gone. The references are the other process's own list of ports and the claim files themselves.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/common/LoopbackPorts.h"

namespace cairn::testutil {
namespace {

std::string claimFile(int port) {
  return std::string(kPortClaims) + "/block-" + std::to_string((port - kLowestPort) / kPortBlock);
}

std::string ownerOf(int port) {
  std::ifstream in(claimFile(port));
  std::string pid, start;
  in >> pid >> start;
  return pid + " " + start;
}

// `count` ports drawn by a forked child, as a test process beside this one draws them; the child has
// exited when this returns. `mine` is drawn here while the child draws; `pid`: the child's.
std::vector<int> drawnByAChild(int count, std::vector<int>* mine = nullptr, pid_t* pid = nullptr) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t child = ::fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (pid) *pid = child;
  if (child == 0) {
    ::close(fds[0]);
    const auto ports = freeLoopbackPorts(count);
    const auto bytes = ssize_t(ports.size() * sizeof(int));
    ::_exit(::write(fds[1], ports.data(), size_t(bytes)) == bytes ? 0 : 1);
  }
  ::close(fds[1]);
  if (mine) *mine = freeLoopbackPorts(count);
  std::vector<int> theirs(static_cast<size_t>(count));
  size_t got = 0;
  while (got < theirs.size() * sizeof(int)) {
    const ssize_t n = ::read(fds[0], reinterpret_cast<char*>(theirs.data()) + got, theirs.size() * sizeof(int) - got);
    if (n <= 0) break;
    got += size_t(n);
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (got != theirs.size() * sizeof(int) || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("the child's ports did not arrive");
  return theirs;
}

// Whether a forked child's claimPortBlock(block) takes the block.
bool anotherProcessClaims(int block) {
  const pid_t other = ::fork();
  if (other < 0) throw std::runtime_error("fork failed");
  if (other == 0) ::_exit(claimPortBlock(block) ? 1 : 0);
  int status = 0;
  if (::waitpid(other, &status, 0) != other || !WIFEXITED(status)) throw std::runtime_error("the child did not exit");
  return WEXITSTATUS(status) == 1;
}

TEST(LoopbackPorts, ProcessesDrawingAtOnceNeverShareAPort) {
  std::vector<int> mine;
  const auto theirs = drawnByAChild(150, &mine);  // more than two blocks each
  std::set<int> all(mine.begin(), mine.end());
  EXPECT_EQ(all.size(), mine.size()) << "a port handed out twice to one process";
  for (int port : theirs) EXPECT_EQ(all.count(port), 0u) << "port " << port << " went to both processes";
  all.insert(theirs.begin(), theirs.end());
  EXPECT_EQ(all.size(), 300u);
  for (int port : all) {
    EXPECT_GE(port, kLowestPort);
    EXPECT_LT(port + 1, ephemeralPortLow());
    // A volunteer given `port` takes port + 1 too (--listen's port + 1, for peers behind routers).
    EXPECT_EQ(all.count(port + 1), 0u) << port << " and the port above it were both handed out";
  }
  // Each of this process's ports lies in a block its claim file gives to this process.
  for (int port : mine) EXPECT_EQ(ownerOf(port), processIdentity(::getpid())) << claimFile(port);
}

TEST(LoopbackPorts, APythonProcessClaimsThroughTheSameFiles) {
  // The python module's command line claims a block for its caller: this process (exec: no shell
  // between them).
  const std::string command = "exec /usr/bin/python3 " CAIRN_SOURCE_DIR "/tools/bench/loopback_ports.py 8";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  int base = 0;
  const bool read = std::fscanf(pipe, "%d", &base) == 1;
  ASSERT_EQ(::pclose(pipe), 0) << command;
  ASSERT_TRUE(read) << command << " printed no port";
  EXPECT_EQ(ownerOf(base), processIdentity(::getpid())) << claimFile(base);
  // Another process cannot take it while this one lives ...
  EXPECT_FALSE(anotherProcessClaims((base - kLowestPort) / kPortBlock)) << "a block python claimed was taken";
  // ... and python cannot take a block this process claimed here.
  const int mine = (freeLoopbackPorts(1)[0] - kLowestPort) / kPortBlock;
  const std::string claim = "exec /usr/bin/python3 -c 'import os, sys; sys.path.insert(0, \"" CAIRN_SOURCE_DIR
                            "/tools/bench\"); import loopback_ports as l; print(l._claim(" + std::to_string(mine) +
                            ", os.getpid()))'";
  pipe = ::popen(claim.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char answer[16] = {};
  const bool answered = std::fgets(answer, sizeof answer, pipe) != nullptr;
  ASSERT_EQ(::pclose(pipe), 0) << claim;
  ASSERT_TRUE(answered) << claim;
  EXPECT_EQ(std::string(answer), "False\n") << "python took block " << mine << " this process holds";
}

TEST(LoopbackPorts, ABlockOfAProcessThatIsGoneIsTakenAgain) {
  pid_t child = 0;
  const int port = drawnByAChild(1, nullptr, &child)[0];
  const int block = (port - kLowestPort) / kPortBlock;
  // The child has exited: its block is free. Another test process may have claimed it since
  // (drawing from a random block, and perhaps gone again); then the claim names that process,
  // never the child: the child's claim did not hold it back either.
  if (!claimPortBlock(block)) {
    const std::string owner = ownerOf(port);
    EXPECT_NE(owner.substr(0, owner.find(' ')), std::to_string(child)) << claimFile(port);
    GTEST_SKIP() << claimFile(port) << " was claimed by another live process first";
  }
  EXPECT_EQ(ownerOf(port), processIdentity(::getpid())) << claimFile(port);
  // ... and once this process holds it, another one does not take it.
  EXPECT_FALSE(anotherProcessClaims(block)) << "a live process's block was taken";
}

}  // namespace
}  // namespace cairn::testutil
