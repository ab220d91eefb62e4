// Collectives with ranks as processes over tcp://127.0.0.1 (collectives_rank): each rank checks
// its results against a direct computation (CollectiveChecks) and exits 0; a SIGKILLed rank is
// named by every survivor.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/LoopbackPorts.h"
#include "tests/node/CollectivesHarness.h"

#ifndef CAIRN_COLLECTIVES_RANK_BINARY
#error "the build passes the path of collectives_rank"
#endif

namespace cairn::testing {
namespace {

using Clock = std::chrono::steady_clock;

struct RankProcess {
  pid_t pid = -1;
  std::string stderr_path;
};

std::vector<RankProcess> startRanks(int n, const std::vector<std::string>& extra_args) {
  const auto ports = testutil::freeLoopbackPorts(n);  // tests/common/LoopbackPorts.h
  std::string port_list;
  for (int p : ports) port_list += (port_list.empty() ? "" : ",") + std::to_string(p);
  std::vector<RankProcess> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].stderr_path = ::testing::TempDir() + "collectives_rank_" + std::to_string(::getpid()) +
                           "_" + std::to_string(r) + ".err";
    std::vector<std::string> args = {CAIRN_COLLECTIVES_RANK_BINARY, "--rank", std::to_string(r),
                                     "--ports", port_list};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    const pid_t pid = ::fork();
    if (pid == 0) {
      FILE* err = std::freopen(ranks[r].stderr_path.c_str(), "w", stderr);
      (void)err;
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ranks[r].pid = pid;
  }
  return ranks;
}

int waitForExit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using ProcessCase = std::tuple<int, int64_t, torch::ScalarType>;
class CollectivesOverProcesses : public ::testing::TestWithParam<ProcessCase> {};

TEST_P(CollectivesOverProcesses, MatchDirectComputation) {
  const auto [n, numel, dtype] = GetParam();
  auto ranks = startRanks(n, {"--dtype", dtypeName(dtype), "--numel", std::to_string(numel)});
  for (int r = 0; r < n; ++r) {
    const int code = waitForExit(ranks[r].pid);
    EXPECT_EQ(code, 0) << "rank " << r << ": " << readFile(ranks[r].stderr_path);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tcp, CollectivesOverProcesses,
    ::testing::Values(ProcessCase{2, 1000000, torch::kFloat32}, ProcessCase{3, 1000, torch::kFloat16},
                      ProcessCase{4, 7, torch::kInt64}, ProcessCase{4, 1000000, torch::kBFloat16},
                      ProcessCase{5, 0, torch::kFloat64}, ProcessCase{3, 1, torch::kBool}),
    caseName);

// SIGKILL one rank while all of them all-reduce in a loop: every survivor exits with PeerLost
// (exit code 3) naming the killed rank (how long after the kill is printed: about twice the
// timeout on a quiet machine).
TEST(CollectivesOverProcessesKill, KilledRankIsNamedByEverySurvivor) {
  const int n = 4, victim = 2;
  const auto timeout = 1000ms;
  auto ranks = startRanks(n, {"--mode", "loop", "--timeout-ms", std::to_string(timeout.count())});
  // Kill only once every rank is inside the loop (has finished one all-reduce).
  for (int r = 0; r < n; ++r) {
    const auto give_up = Clock::now() + 60s;
    while (readFile(ranks[r].stderr_path).find("looping") == std::string::npos) {
      ASSERT_LT(Clock::now(), give_up) << "rank " << r << " never started looping";
      std::this_thread::sleep_for(20ms);
    }
  }
  const auto killed_at = Clock::now();
  ::kill(ranks[victim].pid, SIGKILL);
  EXPECT_EQ(waitForExit(ranks[victim].pid), 128 + SIGKILL);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const int code = waitForExit(ranks[r].pid);
    const auto took = Clock::now() - killed_at;
    const std::string err = readFile(ranks[r].stderr_path);
    EXPECT_EQ(code, 3) << "rank " << r << ": " << err;
    EXPECT_NE(err.find("rank" + std::to_string(victim) + " "), std::string::npos) << "rank " << r << ": " << err;
    // How fast is a figure, not an assertion (it depends on the machine's load): printed.
    std::printf("rank %d exited %lld ms after the kill (timeout %lld ms)\n", r,
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
                static_cast<long long>(timeout.count()));
  }
}

}  // namespace
}  // namespace cairn::testing
