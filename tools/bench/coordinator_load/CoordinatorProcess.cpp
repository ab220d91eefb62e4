#include "tools/bench/coordinator_load/CoordinatorProcess.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace cairn::bench::load {

long ticksPerSecond() { return sysconf(_SC_CLK_TCK); }

bool procSample(pid_t pid, ProcSample* out) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!stat || !std::getline(stat, text)) return false;
  // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  out->cpu_ticks = utime + stime;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) out->rss_kb = std::stoull(line.substr(6));
    if (line.rfind("VmHWM:", 0) == 0) out->hwm_kb = std::stoull(line.substr(6));
  }
  return true;
}

CoordinatorProcess::CoordinatorProcess(const std::vector<std::string>& argv, const std::string& log)
    : log_(log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot write " + log);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // this process killed: the coordinator stops too
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], args.data());
    _exit(127);
  }
  ::close(fd);
}

CoordinatorProcess::~CoordinatorProcess() { stop(); }

bool CoordinatorProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    pid_ = -1;
    return false;
  }
  return true;
}

std::string CoordinatorProcess::waitForInvite(const std::string& invite_file,
                                              std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(invite_file);
    std::string invite;
    if (in && std::getline(in, invite) && !invite.empty()) return invite;
    if (!running())
      throw std::runtime_error("the coordinator exited (status " + std::to_string(status_) +
                               ") before writing its invite; see " + log_);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  throw std::runtime_error("the coordinator wrote no invite within " +
                           std::to_string(timeout.count()) + " s; see " + log_);
}

int CoordinatorProcess::stop() {
  if (!running()) return status_;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 100 && running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (running()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    status_ = -1;
  }
  return status_;
}

}  // namespace cairn::bench::load
