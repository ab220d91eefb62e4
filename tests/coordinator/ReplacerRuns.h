// The MemberReplacer tests' runs on disk (MemberReplacerTest.cpp, MemberReplacerSoonerTest.cpp): a
// fresh folder, the 2 x 3 plan of ReplacementNodes.h written with a row per node and a spare, and a
// plan of one node.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "coordinator/CoordinatorStore.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"
#include "tests/common/ScratchDir.h"
#include "tests/coordinator/ReplacementNodes.h"

namespace cairn::coordinator::testing {

inline std::string replacementFreshDir(const std::string& name) {
  return ::cairn::testing::scratchDir("replace_" + name);
}

// twoByThree written into `out` (node.json and a stage file per node, job.json) with a row per
// node held by its own volunteer, and a spare node_6; returns the spare.
inline Member writeTwoByThreeRun(const std::string& out, CoordinatorStore& store) {
  for (const NodeSpec& n : twoByThree()) {
    std::filesystem::create_directories(nodeDirectory(out, n.name));
    writeJsonFile(nodeSpecPath(out, n.name), toJson(n));
    std::ofstream(nodeDirectory(out, n.name) + "/stage.pt", std::ios::binary) << "stage of " << n.name;
    store.putMember(replacementMember(n.name, MemberState::kAssigned, 100, 8, n.cluster * 3 + n.stage));
  }
  JobSpec job;
  job.job_id = "job";
  job.data.location = "/data";
  job.data.format = "idx";
  writeJsonFile(jobSpecPath(out), toJson(job));
  const Member spare = replacementMember("node_6", MemberState::kSpare, 100, 8, 10);
  store.putMember(spare);
  store.setMeta("phase", "planned");
  return spare;
}

// A planned run of one node, node_0, held by `holder`: its node.json, a stage file and job.json
// in `out`, the holder's row and the plan's meta in `store`.
// node_0 placed alone (reachable at 127.0.0.1:7000, or dial-out only: no address), held by `holder`.
inline void placeOneNode(const std::string& out, CoordinatorStore& store, const Member& holder,
                  bool dial_out_only = false) {
  NodeSpec n;
  n.name = "node_0";
  n.job_id = "job";
  n.address = dial_out_only ? "" : "127.0.0.1:7000";
  n.dial_out_only = dial_out_only;
  n.inputs = {{"x", "tensor", "float32", {1, 4}}};
  n.outputs = {{"y", "tensor", "float32", {1, 4}}};
  std::filesystem::create_directories(nodeDirectory(out, n.name));
  writeJsonFile(nodeSpecPath(out, n.name), toJson(n));
  std::ofstream(nodeDirectory(out, n.name) + "/stage.pt") << "s";
  JobSpec job;
  job.job_id = "job";
  job.data.location = "/data";
  job.data.format = "idx";
  writeJsonFile(jobSpecPath(out), toJson(job));
  store.putMember(holder);
  store.setMeta("placed", R"(["node_0"])");
  store.setMeta("phase", "planned");
}

}  // namespace cairn::coordinator::testing
