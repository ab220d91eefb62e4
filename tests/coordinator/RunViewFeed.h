// RunView fed by hand (RunViewTest.cpp, RunViewPrometheusTest.cpp): a temporary folder, member
// rows, step records, and a view set up with a plan and fed heartbeats and metrics batches whose
// figures the tests recompute; kEvil, a hostile node name (quotes, newline, backslash, <script>).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/RunView.h"

namespace cairn::coordinator::testing {

using nlohmann::json;
namespace fs = std::filesystem;

inline const std::string kEvil = "evil\"\n<script>alert(1)</script>\\x";

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() /
            ("cairn_runview_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}())))
               .string();
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

inline Member runViewMember(const std::string& name, const std::string& address, MemberState state) {
  Member m;
  m.name = name;
  m.advertise = address;
  m.state = state;
  return m;
}

inline json stepRecord(int64_t step, double loss, double sps, double compute, double send, double wait) {
  return {{"step", step}, {"epoch", 0}, {"loss", loss}, {"lr", 0.1}, {"samples_per_s", sps},
          {"compute_s", compute}, {"send_s", send}, {"wait_s", wait}};
}

inline std::vector<json> readLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

// Two clusters of two stages: node_1 > node_2 and node_3 > <evil>; node_5 a spare.
inline void setUp(RunView& view) {
  view.syncMembers({runViewMember("node_1", "10.0.0.1:1", MemberState::kAssigned),
                    runViewMember("node_2", "10.0.0.2:1", MemberState::kAssigned),
                    runViewMember("node_3", "10.0.0.3:1", MemberState::kAssigned),
                    runViewMember(kEvil, "<b>x</b>:1", MemberState::kAssigned),
                    runViewMember("node_5", "10.0.0.5:1", MemberState::kSpare)},
                   1000);
  view.place({"node_1", 0, 0, 2});
  view.place({"node_2", 0, 1, 2});
  view.place({"node_3", 1, 0, 2});
  view.place({kEvil, 1, 1, 2});
  view.setNumClusters(2);
  view.setPhase("planned");
}

struct Fed {
  std::vector<MetricsBatch> batches;
};

// The batches of the run: plans from the Roots, 30 steps on every node, an evaluation, a state.
inline Fed feed(RunView& view) {
  Fed fed;
  for (const std::string root : {"node_1", "node_3"})
    fed.batches.push_back({root, "s" + std::to_string(root.back()), 0,
                           {{{"plan", {{"total_steps", 100}, {"steps_per_epoch", 50}, {"batch_size", 32}}}, {"t", 1001.0}}},
                           0});
  const std::vector<std::string> names = {"node_1", "node_2", "node_3", kEvil};
  for (size_t k = 0; k < names.size(); ++k) {
    MetricsBatch b{names[k], "t" + std::to_string(k), 0, {}, 0};
    for (int64_t step = 1; step <= 30; ++step)
      b.records.push_back(stepRecord(step, 2.0 / double(step) + double(k), 100.0 * double(step) + double(k),
                                     0.01 * double(step), 0.001 * double(k + 1), 0.002 * double(step % 3)));
    if (k == 1) b.records.push_back({{"eval", {{"step", 30}, {"samples", 10}, {"loss", 0.7}, {"accuracy", 0.8}, {"perplexity", -1}}}});
    if (k == 3) b.records.push_back({{"state", "paused"}, {"message", "<img src=x onerror=alert(1)>"}, {"t", 1002.0}});
    b.dropped = k == 3 ? 7 : 0;
    fed.batches.push_back(b);
  }
  for (const auto& b : fed.batches) view.ingest(b, 1003);
  view.heartbeat("node_2", "training", 30, 1010);
  return fed;
}

inline double meanLast(const std::function<double(int64_t)>& f, int64_t last, int64_t count) {
  double sum = 0;
  for (int64_t s = last - count + 1; s <= last; ++s) sum += f(s);
  return sum / double(count);
}

}  // namespace cairn::coordinator::testing
