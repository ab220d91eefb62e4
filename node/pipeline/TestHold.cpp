#include "node/pipeline/TestHold.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {
namespace {

struct Hold {
  int cluster = -1;
  int64_t step = -1;
  std::string file;
};

// One CLUSTER:STEP:FILE entry of CAIRN_TEST_HOLD; BadInput naming the variable when malformed.
Hold parseHold(const std::string& entry, const std::string& whole) {
  Hold hold;
  const size_t first = entry.find(':');
  const size_t second = first == std::string::npos ? first : entry.find(':', first + 1);
  try {
    if (second == std::string::npos) throw std::invalid_argument("fields");
    size_t used = 0;
    hold.cluster = std::stoi(entry.substr(0, first), &used);
    if (used != first) throw std::invalid_argument("cluster");
    hold.step = std::stoll(entry.substr(first + 1, second - first - 1), &used);
    if (used != second - first - 1) throw std::invalid_argument("step");
    hold.file = entry.substr(second + 1);
  } catch (const std::exception&) {
    hold.cluster = -1;
  }
  if (hold.cluster < 0 || hold.step < 0 || hold.file.empty())
    CAIRN_THROW(BadInput, "CAIRN_TEST_HOLD is \"", whole, "\"; expected CLUSTER:STEP:FILE[,CLUSTER:STEP:FILE...] "
                "(a test hook)");
  return hold;
}

// Waits before step `at` until hold.file exists, when the hold applies there (see TestHold.h).
void waitAt(const Hold& hold, int64_t at, std::chrono::milliseconds limit) {
  if (std::filesystem::exists(hold.file)) return;  // released (or never held)
  if (at < hold.step && !std::filesystem::exists(hold.file + ".hold")) return;
  CAIRN_INFO("test hold: before step ", at, " until ", hold.file, " exists");
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!std::filesystem::exists(hold.file)) {
    if (std::chrono::steady_clock::now() > deadline) {
      CAIRN_WARN("test hold: ", hold.file, " did not appear in ", limit.count() / 1000, " s; going on");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CAIRN_INFO("test hold: released at step ", at);
}

}  // namespace

std::function<void(int64_t, const std::vector<int64_t>&)> testHoldFromEnvironment(
    int cluster, std::chrono::milliseconds limit) {
  const char* value = std::getenv("CAIRN_TEST_HOLD");
  if (value == nullptr || *value == '\0') return {};
  const std::string text = value;
  std::vector<Hold> holds;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    Hold hold = parseHold(text.substr(begin, comma - begin), text);
    if (hold.cluster == cluster) holds.push_back(std::move(hold));
    begin = comma + 1;
  }
  if (holds.empty()) return {};
  return [holds, limit](int64_t at, const std::vector<int64_t>&) {
    for (const Hold& hold : holds) waitAt(hold, at, limit);  // in the order the variable lists them
  };
}

}  // namespace cairn
