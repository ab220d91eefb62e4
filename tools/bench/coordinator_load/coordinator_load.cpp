// coordinator_load: the coordinator's capacity under many volunteers, without training (issue [Q];
// docs/BENCHMARKS.md "Churn"). It starts a real coordinator (`clusterize --serve` on 127.0.0.1 with
// the model and job given), then --volunteers simulated volunteers in this one process
// (LoadVolunteer.h: each its own CURVE key pair, DEALER and reachability ROUTER; the real protocol
// and cadence) served by --threads poll loops (LoadWorker.h). It times the joins and the plan, then
// measures two windows of --measure-s / 2: messages per second, reply latencies, the coordinator's
// CPU and RSS (/proc), and prints a table and writes --json. No tensors are made here.
// Limits: RLIMIT_NOFILE is raised to its hard limit (the coordinator inherits it) and the ZeroMQ
// context's max sockets to what the run needs; a size the hard limit cannot hold exits 2 saying so.
// Ownership: main owns the coordinator process, the context and the workers. Threads: main (the
// phases), the workers, one /proc sampler.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>

#include "node/transport/CurveSecurity.h"
#include "tools/bench/coordinator_load/LoadReport.h"
#include "tools/bench/coordinator_load/LoadWorker.h"

namespace cairn::bench::load {
namespace {

using std::chrono::milliseconds;
using Seconds = std::chrono::duration<double>;

struct Flags {
  std::string clusterize, model, job, input_shape = "8,1,28,28", work, json;
  std::vector<std::string> coordinator_args;
  int volunteers = 100, placed = 0, threads = 8, first_port = 20000;
  double join_rate = 200, measure_s = 60, settle_s = 10, setup_timeout_s = 900;
  double probe_kib = 1024, checkpoint_kib = 1024, checkpoint_every_s = 30, step_s = 0.5;
  double piece_kib = 4096, chunk_every_s = 30;
  bool lockstep = false;
  int echo_ms = 0;
  std::string libtorch = "99.0.0";
};

void addFlags(CLI::App& app, Flags& f) {
  app.add_option("--clusterize", f.clusterize, "the clusterize binary")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--model", f.model, "TorchScript model the coordinator plans")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--job", f.job, "job.json the coordinator plans")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--input-shape", f.input_shape, "clusterize --input-shape")->capture_default_str();
  app.add_option("--work", f.work, "folder for the coordinator's --out, invite and log")
      ->required();
  app.add_option("--json", f.json, "write the figures here");
  app.add_option("--coordinator-arg", f.coordinator_args, "one more clusterize argument (repeat)");
  app.add_option("--volunteers", f.volunteers, "simulated volunteers")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--placed", f.placed,
                 "the coordinator plans once this many joined (--min/--max-volunteers); 0: all")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--first-port", f.first_port,
                 "volunteer i answers reach checks on 127.0.0.1:(this + 2i) and the next port")
      ->check(CLI::Range(1024, 65535))
      ->capture_default_str();
  app.add_option("--threads", f.threads,
                 "poll-loop threads (a loop's turn grows with its volunteers: with 4 loops for 1,000 "
                 "volunteers the generator's own turns added ~50 ms to the latencies it measured)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--join-rate", f.join_rate, "volunteers starting their join per second")
      ->check(CLI::Range(0.1, 100000.0))
      ->capture_default_str();
  app.add_option("--measure-s", f.measure_s, "measured seconds (two windows)")
      ->check(CLI::Range(2.0, 86400.0))
      ->capture_default_str();
  app.add_option("--settle-s", f.settle_s,
                 "seconds between the last assignment and the measurement")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--setup-timeout-s", f.setup_timeout_s,
                 "longest wait for the coordinator, the joins and the plan")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_option("--probe-kib", f.probe_kib, "bandwidth probe size (the real provider: 8192)")
      ->check(CLI::Range(1.0, 65536.0))
      ->capture_default_str();
  app.add_option("--checkpoint-kib", f.checkpoint_kib, "checkpoint upload size (0: none)")
      ->check(CLI::Range(0.0, 1048576.0))
      ->capture_default_str();
  app.add_option("--checkpoint-every-s", f.checkpoint_every_s,
                 "an assigned volunteer's upload period")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--step-s", f.step_s, "seconds per simulated step (one step record each)")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app.add_flag("--lockstep", f.lockstep,
               "every volunteer's steps and metrics batches start at its assignment (all the "
               "batches arrive together each second); default: each at a random point of its period");
  app.add_option("--echo-ms", f.echo_ms,
                 "every member sends a 64-byte bandwidth probe this often, answered at once (the "
                 "path's latency without the commit: `echo` in the windows); 0: none")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--piece-kib", f.piece_kib, "chunk piece size a Root asks for")
      ->check(CLI::Range(1.0, 16384.0))
      ->capture_default_str();
  app.add_option("--chunk-every-s", f.chunk_every_s,
                 "a Root fetches its chunks again this long after the last")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  app.add_option("--libtorch", f.libtorch,
                 "the libtorch version the joins claim (refused when older than the coordinator's)")
      ->capture_default_str();
}

// Soft RLIMIT_NOFILE to its hard limit; false when even that cannot hold `need` descriptors.
bool raiseFileLimit(uint64_t need, std::string* why) {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
  if (r.rlim_max != RLIM_INFINITY && r.rlim_max < need) {
    *why = "RLIMIT_NOFILE's hard limit is " + std::to_string(r.rlim_max) +
           " but this size needs about " + std::to_string(need) +
           " descriptors in this process (2 per volunteer, 7 while joining)";
    return false;
  }
  return true;
}

std::vector<std::string> coordinatorArgv(const Flags& f, int placed) {
  std::vector<std::string> a = {f.clusterize,
                                "--model",
                                f.model,
                                "--job",
                                f.job,
                                "--input-shape",
                                f.input_shape,
                                "--serve",
                                "127.0.0.1:0",
                                "--invite-file",
                                f.work + "/invite.txt",
                                "--out",
                                f.work + "/coordinator",
                                "--min-volunteers",
                                std::to_string(placed),
                                "--max-volunteers",
                                std::to_string(placed)};
  a.insert(a.end(), f.coordinator_args.begin(), f.coordinator_args.end());
  return a;
}

VolunteerOptions volunteerOptions(const Flags& f, const std::string& invite) {
  auto ms = [](double s) { return milliseconds(int64_t(s * 1000)); };
  VolunteerOptions o;
  o.invite = parseInvite(invite);
  o.libtorch = f.libtorch;
  o.probe_bytes = size_t(f.probe_kib * 1024);
  o.step = ms(f.step_s);
  o.checkpoint_bytes = size_t(f.checkpoint_kib * 1024);
  o.checkpoint_every = ms(f.checkpoint_every_s);
  o.piece_bytes = size_t(f.piece_kib * 1024);
  o.chunk_every = ms(f.chunk_every_s);
  o.join_timeout = ms(f.setup_timeout_s);
  o.lockstep = f.lockstep;
  o.echo_every = std::chrono::milliseconds(f.echo_ms);
  return o;
}

// Samples the coordinator once a second (the whole run's RSS and CPU over time) on its own thread.
class Sampler {
 public:
  Sampler(pid_t pid, Clock::time_point origin)
      : pid_(pid), origin_(origin), thread_([this] { run(); }) {}
  ~Sampler() {
    stop_ = true;
    thread_.join();
  }
  ProcSample now(pid_t pid) const {
    ProcSample s;
    procSample(pid, &s);
    s.t = Seconds(Clock::now() - origin_).count();
    return s;
  }
  std::vector<ProcSample> samples() {
    std::lock_guard<std::mutex> lock(mutex_);
    return samples_;
  }

 private:
  void run() {
    while (!stop_) {
      ProcSample s = now(pid_);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        samples_.push_back(s);
      }
      for (int i = 0; i < 10 && !stop_; ++i) std::this_thread::sleep_for(milliseconds(100));
    }
  }
  pid_t pid_;
  Clock::time_point origin_;
  std::mutex mutex_;
  std::vector<ProcSample> samples_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Waits until `done()` or `timeout`, printing `what` every 10 s; false on timeout or a dead
// coordinator.
bool waitFor(const std::function<bool()>& done, double timeout_s, CoordinatorProcess& coordinator,
             const std::function<std::string()>& what) {
  const auto start = Clock::now();
  auto next_print = start + std::chrono::seconds(10);
  while (!done()) {
    if (!coordinator.running() || Seconds(Clock::now() - start).count() > timeout_s) return false;
    if (Clock::now() >= next_print) {
      std::cout << "  " << what() << std::endl;
      next_print += std::chrono::seconds(10);
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  return true;
}

struct Setup {
  Clock::time_point start;  // the first volunteer's probe
  double accepted_s = -1, assigned_s = -1;
  std::string stopped_by;
};

// The joins, then the plan: when every volunteer was accepted (or failed), and when the assignments
// stopped coming (none for 5 s after the first).
Setup joinAndPlan(const Flags& f, int placed, Progress& progress, CoordinatorProcess& coordinator,
                  Clock::time_point start) {
  Setup s;
  s.start = start;
  const int n = f.volunteers;
  auto status = [&] {
    return "accepted " + std::to_string(progress.accepted.load()) + "/" + std::to_string(n) +
           ", assigned " + std::to_string(progress.assigned.load()) + ", failed " +
           std::to_string(progress.failed.load());
  };
  if (!waitFor([&] { return progress.accepted + progress.failed >= n; }, f.setup_timeout_s,
               coordinator, status)) {
    s.stopped_by = "the joins did not finish within --setup-timeout-s (" + status() + ")";
    return s;
  }
  s.accepted_s = Seconds(Clock::now() - start).count();
  std::cout << "all joined in " << s.accepted_s << " s (" << status() << ")" << std::endl;
  if (progress.accepted < placed) {  // the coordinator would wait for the missing ones for ever
    s.stopped_by = "only " + std::to_string(progress.accepted.load()) +
                   " volunteers were accepted; the coordinator plans at " + std::to_string(placed);
    return s;
  }
  int last = -1;
  auto changed = Clock::now();
  const bool planned = waitFor(
      [&] {
        const int now = progress.assigned.load();
        if (now != last) {
          last = now;
          changed = Clock::now();
        }
        return now > 0 && Clock::now() - changed > std::chrono::seconds(5);
      },
      f.setup_timeout_s, coordinator, status);
  if (!planned) {
    s.stopped_by = "no plan within --setup-timeout-s (" + status() + ")";
    return s;
  }
  s.assigned_s = Seconds(changed - start).count();
  std::cout << "assignments done " << s.assigned_s << " s after the first join (" << status() << ")"
            << std::endl;
  return s;
}

// The two measured windows, after --settle-s.
std::vector<MeasuredWindow> measure(const Flags& f, Progress& progress,
                                    CoordinatorProcess& coordinator, Sampler& sampler,
                                    std::string* stopped_by) {
  std::this_thread::sleep_for(Seconds(f.settle_s));
  std::vector<MeasuredWindow> windows;
  for (int w = 1; w <= 2; ++w) {
    MeasuredWindow m;
    progress.window = w;
    m.begin = sampler.now(coordinator.pid());
    m.self_begin = sampler.now(getpid());
    m.self_begin.t = m.begin.t;
    std::this_thread::sleep_for(Seconds(f.measure_s / 2));
    if (!coordinator.running()) {
      *stopped_by = "the coordinator exited during window " + std::to_string(w) + "; see " +
                    f.work + "/coordinator.log";
      return windows;
    }
    m.end = sampler.now(coordinator.pid());
    m.self_end = sampler.now(getpid());
    m.self_end.t = m.end.t;
    windows.push_back(m);
    std::cout << "window " << w << " measured" << std::endl;
  }
  return windows;
}

int runLoad(const Flags& f) {
  const int n = f.volunteers;
  const int placed = f.placed > 0 ? std::min(f.placed, n) : n;
  std::string why;
  if (f.first_port + 2 * n - 1 > 65535) {
    std::cerr << "coordinator_load: --first-port " << f.first_port << " + 2 x --volunteers " << n
              << " passes port 65535 (each volunteer answers on two ports)\n";
    return 2;
  }
  if (!raiseFileLimit(uint64_t(2 * n) + 7 * uint64_t(std::max(10.0, f.join_rate)) + 256, &why)) {
    std::cerr << "coordinator_load: --volunteers " << n << ": " << why << "\n";
    return 2;
  }
  std::filesystem::remove_all(f.work + "/coordinator");
  std::filesystem::remove(f.work + "/invite.txt");
  std::filesystem::create_directories(f.work);
  const auto origin = Clock::now();
  CoordinatorProcess coordinator(coordinatorArgv(f, placed), f.work + "/coordinator.log");
  const VolunteerOptions options =
      volunteerOptions(f, coordinator.waitForInvite(f.work + "/invite.txt",
                                                    std::chrono::seconds(int(f.setup_timeout_s))));
  std::cout << "coordinator " << coordinator.pid() << " is up; " << n << " volunteers join at "
            << f.join_rate << "/s, " << placed << " to be placed" << std::endl;
  zmq::context_t context;
  context.set(zmq::ctxopt::max_sockets, 2 * n + 64);
  context.set(zmq::ctxopt::io_threads, 2);
  ZapAuthenticator zap(context, {{options.invite.coordinator_key, "coordinator"}});
  Progress progress;
  std::vector<std::unique_ptr<LoadWorker>> workers;
  for (int t = 0; t < f.threads; ++t) workers.push_back(std::make_unique<LoadWorker>(progress));
  const auto start = Clock::now() + milliseconds(500);
  for (int i = 0; i < n; ++i) {
    LoadWorker& w = *workers[size_t(i % f.threads)];
    const auto at = start + std::chrono::duration_cast<Clock::duration>(Seconds(i / f.join_rate));
    // Two ports each: its own and the next (the reachability of a provider's accept port).
    w.add(std::make_unique<LoadVolunteer>(context, options, w.recorder(), at, f.first_port + 2 * i));
  }
  Sampler sampler(coordinator.pid(), origin);
  for (auto& w : workers) w->start();
  Setup setup = joinAndPlan(f, placed, progress, coordinator, start);
  RunFigures figures;
  if (setup.stopped_by.empty())
    figures.windows = measure(f, progress, coordinator, sampler, &setup.stopped_by);
  progress.stop = true;
  for (auto& w : workers) w->join();
  figures.volunteers = n;
  figures.accepted = progress.accepted;
  figures.assigned = progress.assigned;
  figures.failed = progress.failed;
  figures.rejected = progress.rejected;
  figures.all_accepted_s = setup.accepted_s;
  figures.all_assigned_s = setup.assigned_s;
  figures.stopped_by = setup.stopped_by;
  figures.samples = sampler.samples();
  std::vector<const LoadRecorder*> recorders;
  for (auto& w : workers) {
    recorders.push_back(&w->recorder());
    figures.problems += w->recorder().problems();
  }
  nlohmann::json report = reportJson(figures, recorders);
  report["flags"] = {{"volunteers", n},
                     {"placed", placed},
                     {"threads", f.threads},
                     {"join_rate", f.join_rate},
                     {"measure_s", f.measure_s},
                     {"probe_kib", f.probe_kib},
                     {"checkpoint_kib", f.checkpoint_kib},
                     {"checkpoint_every_s", f.checkpoint_every_s},
                     {"step_s", f.step_s},
                     {"piece_kib", f.piece_kib},
                     {"chunk_every_s", f.chunk_every_s},
                     {"lockstep", f.lockstep},
                     {"echo_ms", f.echo_ms},
                     {"coordinator_args", f.coordinator_args}};
  for (auto& w : workers) w->close();  // the sockets, before the authenticator and context
  report["coordinator_exit"] = coordinator.stop();
  if (!f.json.empty()) std::ofstream(f.json) << report.dump(1) << "\n";
  std::cout << reportTable(report);
  if (!setup.stopped_by.empty()) std::cout << "stopped: " << setup.stopped_by << "\n";
  return setup.stopped_by.empty() ? 0 : 1;
}

}  // namespace
}  // namespace cairn::bench::load

int main(int argc, char** argv) {
  CLI::App app(
      "coordinator_load: simulated volunteers (the real protocol, no training) against a real "
      "coordinator; docs/BENCHMARKS.md \"Churn\"");
  cairn::bench::load::Flags flags;
  cairn::bench::load::addFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the message naming the flag (or the help)
    return code == 0 ? 0 : 2;
  }
  try {
    return cairn::bench::load::runLoad(flags);
  } catch (const std::exception& e) {
    std::cerr << "coordinator_load: error: " << e.what() << "\n";
    return 1;
  }
}
