#include "TestModels.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "core/JsonReader.h"

namespace cairn::clusterize::testing {

std::string sourceDirectory() { return CAIRN_CLUSTERIZE_TEST_SOURCE_DIR; }

namespace {

// A folder made for this test process, removed when the process exits.
std::string processFolder(const std::string& prefix) {
  static std::vector<std::string> folders;
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  if (folders.empty())
    std::atexit([] {
      for (const auto& folder : folders) std::filesystem::remove_all(folder);
    });
  folders.push_back(pattern);
  return pattern;
}

}  // namespace

const std::string& modelDirectory() {
  static const std::string dir = [] {
    const std::string made = processFolder("cairn_clusterize");
    const std::string command = "/usr/bin/python3 " + sourceDirectory() + "/make_models.py " + made;
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
    return made;
  }();
  return dir;
}

std::string modelPath(const std::string& name) { return modelDirectory() + "/" + name + ".pt"; }

std::string temporaryDirectory(const std::string& tag) {
  static const std::string root = processFolder("cairn_clusterize_work");
  static int counter = 0;
  const std::string dir = root + "/" + tag + "_" + std::to_string(++counter);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<c10::IValue> exampleInputs(const std::string& name, int64_t batch) {
  at::manual_seed(7);
  if (name == "cnn" || name == "wrapped_cnn" || name == "resnet")
    return {torch::randn({batch, 1, 28, 28})};
  if (name == "gpt" || name == "gpt_tied" || name == "gpt_late_pos") return {torch::randint(0, 50, {batch, 10})};
  if (name == "two_input") return {torch::randn({batch, 12}), torch::randn({batch, 6})};
  throw std::runtime_error("no inputs for " + name);
}

CliRun runClusterize(const std::string& arguments) {
  const std::string command = std::string(CAIRN_CLUSTERIZE_BINARY) + " " + arguments + " 2>&1";
  CliRun r;
  FILE* pipe = popen(command.c_str(), "r");
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) r.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string writeNodes(const std::string& dir, const std::vector<double>& ram_gb) {
  nlohmann::json nodes = nlohmann::json::object();
  for (size_t i = 0; i < ram_gb.size(); ++i)
    nodes[std::to_string(i)] = {{"IP", "127.0.0.1:" + std::to_string(6100 + i)},
                                {"benchmarks", {{"ram", ram_gb[i]}, {"bandwidth", 100 + 50 * i}}}};
  const std::string path = dir + "/node_configs.json";
  writeJsonFile(path, nodes);
  return path;
}

std::string writeNodes(const std::string& dir, int count, double ram_gb) {
  return writeNodes(dir, std::vector<double>(count, ram_gb));
}

}  // namespace cairn::clusterize::testing
