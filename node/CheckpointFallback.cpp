// Stand-in for trainer/Checkpoint.cpp's validCheckpointSteps until branch issue-ckpt is merged:
// a weak definition, so the real (strong) one replaces it at link time as soon as it exists.
// It lists <dir>/step_<N>.ckpt without verifying them. Delete this file once trainer/Checkpoint.cpp
// is in main.
#include <filesystem>
#include <regex>

#include "trainer/Checkpoint.h"

namespace cairn {

__attribute__((weak)) std::vector<int64_t> validCheckpointSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  static const std::regex name("step_([0-9]{1,18})\\.ckpt");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, m, name)) steps.push_back(std::stoll(m[1].str()));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace cairn
