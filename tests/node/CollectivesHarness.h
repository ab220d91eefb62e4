// The collectives tests' harness (Collectives*Test.cpp): ranks as threads, each with its own
// ZmqTransport over inproc:// (one zmq context) and a ProcessGroup over its Mailbox; the groups'
// options; the parametrised cases' names.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/Error.h"
#include "node/transport/ZmqTransport.h"
#include "tests/node/CollectiveChecks.h"

namespace cairn::testing {

using namespace std::chrono_literals;

inline std::vector<std::string> rankNames(int n) {
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("rank" + std::to_string(r));
  return names;
}

// What each rank thread ended with: "" or the error it threw (with its kind).
struct RankOutcome {
  std::string error;
  std::optional<ErrorKind> kind;
};

// Runs body(rank, group) on one thread per rank, each with its own ZmqTransport over inproc://
// and a ProcessGroup over its Mailbox. `silent` ranks bind their transport but never call a
// collective (they hold it until the others are done); `absent` ranks never bind at all.
inline std::vector<RankOutcome> runRanks(int n, const ProcessGroupOptions& options,
                                         const std::function<void(int, ProcessGroup&)>& body,
                                         std::vector<int> silent = {}, std::vector<int> absent = {}) {
  static std::atomic<int> run_counter{0};
  const std::string prefix = "inproc://collectives" + std::to_string(run_counter++) + "_";
  const auto names = rankNames(n);
  zmq::context_t context;
  std::vector<RankOutcome> outcomes(n);
  std::atomic<int> active{0};
  std::vector<std::thread> threads;
  auto contains = [](const std::vector<int>& v, int r) {
    return std::find(v.begin(), v.end(), r) != v.end();
  };
  for (int r = 0; r < n; ++r) {
    if (contains(absent, r) || contains(silent, r)) continue;
    ++active;
  }
  for (int r = 0; r < n; ++r) {
    if (contains(absent, r)) continue;
    threads.emplace_back([&, r] {
      try {
        ZmqTransport transport(context, names[r], prefix + names[r]);
        for (int p = 0; p < n; ++p)
          if (p != r) transport.addPeer(names[p], prefix + names[p]);
        if (contains(silent, r)) {
          while (active.load() > 0) std::this_thread::sleep_for(5ms);
          return;
        }
        Mailbox mailbox(transport);
        ProcessGroup group(mailbox, "test", names, names[r], options);
        try {
          body(r, group);
        } catch (...) {
          --active;
          throw;
        }
        --active;
      } catch (const Error& e) {
        outcomes[r] = {e.what(), e.kind()};
      } catch (const std::exception& e) {
        outcomes[r] = {e.what(), std::nullopt};
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

inline ProcessGroupOptions testOptions() {
  ProcessGroupOptions options;
  options.timeout = 20s;            // a hang fails the test instead of stalling it
  options.segment_bytes = 64 * 1024;  // 10^6 elements cross the wire in many pipelined segments
  return options;
}

// The parametrised cases' groups cut a large tensor into 16 KiB segments: 2.5 * 10^5 float32
// elements cross in as many pipelined segments (62) as 10^6 did in testOptions()' 64 KiB, with a
// quarter of the bytes to copy and reduce; every block of a large case still spans several
// segments (a ring, not a direct exchange), and the small cases (<= 8 KB) fit one either way.
inline ProcessGroupOptions overThreadsOptions() {
  ProcessGroupOptions options = testOptions();
  options.segment_bytes = 16 * 1024;
  return options;
}

using CollectiveCase = std::tuple<int, int64_t, torch::ScalarType>;

inline std::string caseName(const ::testing::TestParamInfo<CollectiveCase>& info) {
  const auto [n, numel, dtype] = info.param;
  return "n" + std::to_string(n) + "_numel" + std::to_string(numel) + "_" + dtypeName(dtype);
}

}  // namespace cairn::testing
