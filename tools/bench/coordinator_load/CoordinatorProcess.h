// CoordinatorProcess: the real coordinator (`clusterize --serve`) that tools/bench/coordinator_load
// measures, started as a child process on 127.0.0.1 with its output in <work>/coordinator.log, and
// what /proc says about a process (CPU ticks: utime + stime of /proc/PID/stat; VmRSS and VmHWM of
// /proc/PID/status).
// Ownership: owns the child: stop() (or the destructor, or this process ending: PR_SET_PDEATHSIG)
// sends it SIGTERM, then SIGKILL after 10 s,
// and reaps it; it never signals any other process. Thread-safety: one thread; procSample() any.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace cairn::bench::load {

struct ProcSample {
  double t = 0;            // seconds since the run's start
  uint64_t cpu_ticks = 0;  // utime + stime
  uint64_t rss_kb = 0, hwm_kb = 0;
};
// nullopt-like: ok false when the process is gone.
bool procSample(pid_t pid, ProcSample* out);
long ticksPerSecond();

class CoordinatorProcess {
 public:
  // Starts `argv` (argv[0] the clusterize binary) with stdout and stderr into `log`.
  CoordinatorProcess(const std::vector<std::string>& argv, const std::string& log);
  ~CoordinatorProcess();
  CoordinatorProcess(const CoordinatorProcess&) = delete;
  CoordinatorProcess& operator=(const CoordinatorProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The invite it wrote to `invite_file`, waiting at most `timeout`; throws (naming the log) when
  // the coordinator exits first or the time passes.
  std::string waitForInvite(const std::string& invite_file, std::chrono::seconds timeout);
  bool running();
  // SIGTERM (its clean stop), SIGKILL after 10 s; returns its exit status (-1: killed or unknown).
  int stop();

 private:
  pid_t pid_ = -1;
  std::string log_;
  int status_ = -1;
};

}  // namespace cairn::bench::load
