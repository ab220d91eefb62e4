#include "node/pipeline/TestHold.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

std::function<void(int64_t, const std::vector<int64_t>&)> testHoldFromEnvironment(
    int cluster, std::chrono::milliseconds limit) {
  const char* value = std::getenv("CAIRN_TEST_HOLD");
  if (value == nullptr || *value == '\0') return {};
  const std::string text = value;
  const size_t first = text.find(':');
  const size_t second = first == std::string::npos ? first : text.find(':', first + 1);
  int held_cluster = -1;
  int64_t step = -1;
  try {
    if (second == std::string::npos) throw std::invalid_argument("fields");
    size_t used = 0;
    held_cluster = std::stoi(text.substr(0, first), &used);
    if (used != first) throw std::invalid_argument("cluster");
    step = std::stoll(text.substr(first + 1, second - first - 1), &used);
    if (used != second - first - 1) throw std::invalid_argument("step");
  } catch (const std::exception&) {
    held_cluster = -1;
  }
  const std::string file = second == std::string::npos ? "" : text.substr(second + 1);
  if (held_cluster < 0 || step < 0 || file.empty())
    CAIRN_THROW(BadInput, "CAIRN_TEST_HOLD is \"", text, "\"; expected CLUSTER:STEP:FILE (a test hook)");
  if (held_cluster != cluster) return {};
  return [step, file, limit](int64_t at, const std::vector<int64_t>&) {
    if (std::filesystem::exists(file)) return;  // released (or never held)
    if (at < step && !std::filesystem::exists(file + ".hold")) return;
    CAIRN_INFO("test hold: before step ", at, " until ", file, " exists");
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!std::filesystem::exists(file)) {
      if (std::chrono::steady_clock::now() > deadline) {
        CAIRN_WARN("test hold: ", file, " did not appear in ", limit.count() / 1000, " s; going on");
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CAIRN_INFO("test hold: released at step ", at);
  };
}

}  // namespace cairn
