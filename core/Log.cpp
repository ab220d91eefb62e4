#include "core/Log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace cairn {
namespace {

LogLevel levelFromEnvironment() {
  const char* text = std::getenv("CAIRN_LOG_LEVEL");
  if (!text || !*text) return LogLevel::kInfo;
  try {
    return parseLogLevel(text);
  } catch (const Error&) {
    return LogLevel::kInfo;  // a bad value must not stop a node; logLevel() users see info
  }
}

std::atomic<int>& levelStorage() {
  static std::atomic<int> level{static_cast<int>(levelFromEnvironment())};
  return level;
}

std::mutex& tagMutex() {
  static std::mutex m;
  return m;
}
std::string& tagStorage() {
  static std::string tag;
  return tag;
}

}  // namespace

LogLevel logLevel() { return static_cast<LogLevel>(levelStorage().load()); }
void setLogLevel(LogLevel level) { levelStorage().store(static_cast<int>(level)); }

LogLevel parseLogLevel(const std::string& text) {
  if (text == "error") return LogLevel::kError;
  if (text == "warn") return LogLevel::kWarn;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  CAIRN_THROW(BadInput, "CAIRN_LOG_LEVEL: expected one of error, warn, info, debug (got \"", text,
              "\")");
}

void setLogTag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(tagMutex());
  tagStorage() = tag;
}

void logLine(LogLevel level, const std::string& message) {
  using Clock = std::chrono::system_clock;
  const auto now = Clock::now();
  const std::time_t seconds = Clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  static const char kLetters[] = {'E', 'W', 'I', 'D'};
  std::string line;
  {
    std::lock_guard<std::mutex> lock(tagMutex());
    line = detail::concat(stamp, '.', millis / 100, (millis / 10) % 10, millis % 10, ' ',
                          kLetters[static_cast<int>(level)], ' ');
    if (!tagStorage().empty()) line += "[" + tagStorage() + "] ";
  }
  line += message;
  line += '\n';
  // One write() per record so lines from threads and processes sharing a terminal do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace cairn
