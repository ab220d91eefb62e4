#include "TestModels.h"

#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

namespace cairn::clusterize::testing {

std::string sourceDirectory() { return CAIRN_CLUSTERIZE_TEST_SOURCE_DIR; }

const std::string& modelDirectory() {
  static const std::string dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "cairn_clusterize_XXXXXX").string();
    char* made = mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    const std::string command = "/usr/bin/python3 " + sourceDirectory() + "/make_models.py " + made;
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
    static std::string to_remove = made;
    std::atexit([] { std::filesystem::remove_all(to_remove); });
    return std::string(made);
  }();
  return dir;
}

std::string modelPath(const std::string& name) { return modelDirectory() + "/" + name + ".pt"; }

std::string temporaryDirectory(const std::string& tag) {
  static int counter = 0;
  const std::string dir = modelDirectory() + "/" + tag + "_" + std::to_string(++counter);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<c10::IValue> exampleInputs(const std::string& name, int64_t batch) {
  at::manual_seed(7);
  if (name == "cnn" || name == "wrapped_cnn" || name == "resnet")
    return {torch::randn({batch, 1, 28, 28})};
  if (name == "gpt" || name == "gpt_tied") return {torch::randint(0, 50, {batch, 10})};
  if (name == "two_input") return {torch::randn({batch, 12}), torch::randn({batch, 6})};
  throw std::runtime_error("no inputs for " + name);
}

}  // namespace cairn::clusterize::testing
