// Test models for clusterize_tests: scripted once per test run by Debian's Python torch
// (make_models.py) into a temporary folder, plus helpers shared by the suites.
#pragma once

#include <string>
#include <vector>

#include <torch/script.h>

namespace cairn::clusterize::testing {

// Folder holding cnn.pt, wrapped_cnn.pt, resnet.pt, gpt.pt, gpt_tied.pt, two_input.pt,
// gpt_late_pos.pt (created on
// first use; the test fails if Python cannot script them).
const std::string& modelDirectory();
std::string modelPath(const std::string& name);
// A fresh folder under a temporary folder of this process (removed when it exits); it does not
// make the models.
std::string temporaryDirectory(const std::string& tag);
// Deterministic example inputs for each test model (batch sizes small to keep tests fast).
std::vector<c10::IValue> exampleInputs(const std::string& name, int64_t batch = 4);
std::string sourceDirectory();  // tests/clusterize in the source tree

// The clusterize binary run with `arguments` (shell words), stdout and stderr together.
struct CliRun {
  int code = -1;
  std::string output;
};
CliRun runClusterize(const std::string& arguments);
// node_configs.json in `dir` with `count` nodes of `ram_gb` each (bandwidths 100, 150, ...).
std::string writeNodes(const std::string& dir, int count, double ram_gb);
// The same with one RAM figure per node.
std::string writeNodes(const std::string& dir, const std::vector<double>& ram_gb);

}  // namespace cairn::clusterize::testing
