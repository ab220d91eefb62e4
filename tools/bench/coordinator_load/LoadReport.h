// LoadReport: the figures of one tools/bench/coordinator_load run — the join and plan times, and
// per measured window the messages per second the coordinator took, its CPU (% of one core) and
// RSS, and the reply latencies (p50/p99) — as JSON (written to --json) and as the table printed.
// Ownership: plain values. Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/bench/coordinator_load/CoordinatorProcess.h"
#include "tools/bench/coordinator_load/LoadRecorder.h"

namespace cairn::bench::load {

struct MeasuredWindow {
  ProcSample begin, end;            // the coordinator at its two ends
  ProcSample self_begin, self_end;  // the load generator itself (it shares the machine)
};

struct RunFigures {
  int volunteers = 0, accepted = 0, assigned = 0, failed = 0, rejected = 0;
  double all_accepted_s = -1;           // from the first probe sent to the last `accepted`
  double all_assigned_s = -1;           // … to the last `assignment`
  std::vector<MeasuredWindow> windows;  // the two measured windows
  std::vector<ProcSample> samples;      // the coordinator, once a second over the whole run
  uint64_t problems = 0;
  std::string stopped_by;  // why a size could not run to its end (empty: it did)
};

// The figures as JSON: recorders' counts merged over every worker.
nlohmann::json reportJson(const RunFigures& f, const std::vector<const LoadRecorder*>& recorders);
// The one-line-per-window table of `report` (reportJson's output).
std::string reportTable(const nlohmann::json& report);

}  // namespace cairn::bench::load
