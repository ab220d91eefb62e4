// Test helper for the dataset tests: runs a fixture script (tests/trainer/make_*_files.py, with
// /usr/bin/python3) once per process into a temporary folder, reads its reference tensors, and
// checks that a call fails with a BadInput naming a file.
#pragma once

#include <gtest/gtest.h>
#include <torch/script.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>

#include "core/Error.h"
#include "core/Safetensors.h"

namespace cairn::testing {

// The folders the fixture scripts wrote, removed when the test process exits.
struct FixtureFolders {
  std::map<std::string, std::string> by_script;
  ~FixtureFolders() {
    for (const auto& [script, folder] : by_script) {
      std::error_code ignored;
      std::filesystem::remove_all(folder, ignored);
      std::filesystem::remove(folder + ".log", ignored);
    }
  }
};

// The folder the script wrote (created once per process; the script's output is shown on failure).
inline std::string datasetFixture(const std::string& script) {
  static FixtureFolders folders;
  std::map<std::string, std::string>& made = folders.by_script;
  auto it = made.find(script);
  if (it != made.end()) return it->second;
  const std::string out = ::testing::TempDir() + "/cairn_" + script.substr(0, script.find('.')) +
                          "_" + std::to_string(::getpid());
  std::filesystem::remove_all(out);
  const std::string command = std::string(CAIRN_PYTHON) + " " + CAIRN_SOURCE_DIR +
                              "/tests/trainer/" + script + " " + out + " > " + out + ".log 2>&1";
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    std::ifstream log(out + ".log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    ADD_FAILURE() << command << " failed (" << rc << "):\n" << text;
  }
  made[script] = out;
  return out;
}

inline std::map<std::string, torch::Tensor> readReference(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : readSafetensors(path)) out[name] = t;
  return out;
}

inline std::vector<int64_t> idsOf(const torch::Tensor& t) {
  torch::Tensor c = t.to(torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// `call` must throw BadInput whose message names `file`.
inline void expectBadInputNaming(const std::function<void()>& call, const std::string& file,
                                 const std::string& also = "") {
  try {
    call();
    ADD_FAILURE() << "no error for " << file;
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos)
        << "message does not name " << file << ": " << e.what();
    if (!also.empty()) {
      EXPECT_NE(std::string(e.what()).find(also), std::string::npos)
          << "message lacks \"" << also << "\": " << e.what();
    }
  }
}

}  // namespace cairn::testing
