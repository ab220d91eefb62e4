// MetricsLog writes one JSON object per line (metrics.jsonl next to node.json), flushed per
// record so tools can follow a live run. ProgressLine shows the run to a person: a line redrawn in
// place on a terminal, plain periodic log lines otherwise.
// A tee (provider --join: node/volunteer/VolunteerMetrics.h) is handed every record and its line as written.
// Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace cairn {

class MetricsLog {
 public:
  MetricsLog() = default;  // writes nothing
  // `append`: keep what the file holds (a resumed run adds to its metrics.jsonl); else truncate.
  explicit MetricsLog(const std::string& path, bool append = false);
  void write(const nlohmann::json& record);
  bool enabled() const { return out_.is_open(); }
  // Also hand every record (and its line, without the newline) to `tee`, on the writer's thread.
  using Tee = std::function<void(const nlohmann::json& record, const std::string& line)>;
  void setTee(Tee tee) { tee_ = std::move(tee); }

 private:
  std::ofstream out_;
  std::string path_;
  Tee tee_;
};

struct Progress {
  int64_t epoch = 0;  // 0-based
  int64_t epochs = 0;
  int64_t step = 0;  // steps done
  int64_t total_steps = 0;
  double loss = 0;
  double samples_per_second = 0;
  double elapsed_seconds = 0;
};

class ProgressLine {
 public:
  // `live`: this node draws the progress (the Leaf); others only log at debug level.
  ProgressLine(bool live, double plain_every_seconds);
  void update(const Progress& progress);
  // Ends a live line so the next log line starts on its own.
  void finish();

 private:
  bool live_;
  bool terminal_;
  double plain_every_;
  std::chrono::steady_clock::time_point last_;
  bool drawn_ = false;
  bool first_ = true;
};

std::string formatDuration(double seconds);

}  // namespace cairn
