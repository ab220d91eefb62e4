#include "trainer/Metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

MetricsLog::MetricsLog(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc), path_(path) {
  if (!out_) CAIRN_THROW(BadInput, path, ": cannot write metrics");
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!out_.is_open() && !tee_) return;
  const std::string line = record.dump();
  if (out_.is_open()) {
    out_ << line << '\n';
    out_.flush();
  }
  if (tee_) tee_(record, line);
}

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = int64_t(seconds + 0.5);
  char buffer[32];
  if (s >= 3600)
    std::snprintf(buffer, sizeof buffer, "%lldh%02lldm", (long long)(s / 3600),
                  (long long)(s / 60 % 60));
  else if (s >= 60)
    std::snprintf(buffer, sizeof buffer, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(buffer, sizeof buffer, "%llds", (long long)s);
  return buffer;
}

ProgressLine::ProgressLine(bool live, double plain_every_seconds)
    : live_(live), terminal_(::isatty(STDERR_FILENO) == 1), plain_every_(plain_every_seconds) {}

void ProgressLine::update(const Progress& p) {
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  const bool last_step = p.step == p.total_steps;
  const double remaining =
      p.step > 0 ? p.elapsed_seconds / double(p.step) * double(p.total_steps - p.step) : NAN;
  char line[256];
  std::snprintf(
      line, sizeof line, "epoch %lld/%lld  step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s",
      (long long)(p.epoch + 1), (long long)p.epochs, (long long)p.step, (long long)p.total_steps,
      p.loss, p.samples_per_second, formatDuration(remaining).c_str());
  if (live_ && terminal_) {
    if (since < 0.2 && !last_step && !first_) return;
    std::fprintf(stderr, "\r\033[K%s", line);
    std::fflush(stderr);
    drawn_ = true;
  } else {
    if (since < plain_every_ && !last_step && !first_) return;
    if (live_)
      CAIRN_INFO(line);
    else
      CAIRN_DEBUG(line);
  }
  first_ = false;
  last_ = now;
}

void ProgressLine::finish() {
  if (drawn_) {
    std::fputc('\n', stderr);
    drawn_ = false;
  }
}

}  // namespace cairn
