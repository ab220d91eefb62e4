// A small leveled logger writing one line per record to stderr:
//   2026-11-21 10:00:00.123 I [node_3] message
// The level comes from CAIRN_LOG_LEVEL (error|warn|info|debug, default info); the tag (usually the
// node name) from setLogTag(). Thread-safe: each record is written with one locked write.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/Error.h"

namespace cairn {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel logLevel();
void setLogLevel(LogLevel level);
// Parses "error", "warn", "info", "debug"; throws BadInput naming CAIRN_LOG_LEVEL otherwise.
LogLevel parseLogLevel(const std::string& text);
void setLogTag(const std::string& tag);
void logLine(LogLevel level, const std::string& message);

// Whether the n-th time (from 1) a repeated event happens is worth a log line: the first
// `first_few` times, then the 2nd, 4th, 8th…: a flood (a hostile peer, a peer dialling again every
// 100 ms) costs a line per doubling, not a line per event.
inline bool logWorthy(uint64_t n, uint64_t first_few = 0) {
  return n > 0 && (n <= first_few || (n & (n - 1)) == 0);
}

// A duration in seconds, for a log line or message ("within 2.5 s").
template <typename Rep, typename Period>
double secondsOf(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace cairn

#define CAIRN_LOG(LEVEL, ...)                                                              \
  do {                                                                                     \
    if (static_cast<int>(::cairn::LogLevel::LEVEL) <= static_cast<int>(::cairn::logLevel())) \
      ::cairn::logLine(::cairn::LogLevel::LEVEL, ::cairn::detail::concat(__VA_ARGS__));      \
  } while (0)
#define CAIRN_ERROR(...) CAIRN_LOG(kError, __VA_ARGS__)
#define CAIRN_WARN(...) CAIRN_LOG(kWarn, __VA_ARGS__)
#define CAIRN_INFO(...) CAIRN_LOG(kInfo, __VA_ARGS__)
#define CAIRN_DEBUG(...) CAIRN_LOG(kDebug, __VA_ARGS__)
