// What the multi-process benchmarks (bench_allreduce, bench_rings) share: starting copies of the
// running binary, one per process, and summarising timed rounds.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace cairn::bench {

// Starts `count` copies of this binary with its own arguments plus extra_args(i) (exec, so that
// no process inherits torch's threads) and waits for all; returns the first non-zero exit code.
inline int runCopies(int argc, char** argv, int count,
                     const std::function<std::vector<std::string>(int)>& extra_args) {
  std::vector<pid_t> children;
  for (int i = 0; i < count; ++i) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<std::string> args(argv, argv + argc);
      for (auto& a : extra_args(i)) args.push_back(std::move(a));
      std::vector<char*> child_argv;
      for (auto& a : args) child_argv.push_back(a.data());
      child_argv.push_back(nullptr);
      ::execv("/proc/self/exe", child_argv.data());
      ::_exit(127);
    }
    children.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code != 0 && rc == 0) rc = code;
  }
  return rc;
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// "a,b,c": the rounds for a JSON array.
inline std::string joined(const std::vector<double>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

}  // namespace cairn::bench
