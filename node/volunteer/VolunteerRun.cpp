#include "node/volunteer/VolunteerRun.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "core/Error.h"
#include "core/Log.h"
#include "core/SendPacer.h"
#include "core/NodeData.h"
#include "core/TorchCompat.h"
#include "node/volunteer/Probe.h"
#include "node/pipeline/ProviderRun.h"
#include "node/volunteer/ServedChunks.h"
#include "node/volunteer/VolunteerAssignment.h"
#include "node/volunteer/VolunteerPeers.h"

namespace cairn {

namespace {

// The compute probe (node/volunteer/Probe.h), or CAIRN_TEST_PROBE_MS (tests only, 100 to 1500):
// the suite starts some two hundred volunteers on 2 cores, each probing with every core, and no
// test depends on the figure. Below 500 ms the sgemms are 512² (8 times fewer flops each: a
// 1024² one takes ~45 ms on 2 cores here, and the measurement takes at least 5 rounds of at least
// one, core/MatmulSpeed.h).
struct ComputeProbeSettings {
  int size = kComputeProbeSize;
  std::chrono::milliseconds duration = kComputeProbeDuration;
};

// A volunteer that only relays (provider --relay) trains nothing: its figure is only shown (the
// coordinator's table), so it measures 0.1 s of 512² sgemms and is relaying 1.4 s sooner.
constexpr ComputeProbeSettings kRelayComputeProbe{512, std::chrono::milliseconds(100)};

ComputeProbeSettings computeProbeSettings(bool relay) {
  if (relay) return kRelayComputeProbe;
  ComputeProbeSettings settings;
  const char* value = std::getenv("CAIRN_TEST_PROBE_MS");
  if (!value || !*value) return settings;
  char* end = nullptr;
  const long ms = std::strtol(value, &end, 10);
  if (*end != '\0' || ms < 100 || ms > settings.duration.count())
    CAIRN_THROW(BadInput, "CAIRN_TEST_PROBE_MS=", value, ": expected milliseconds from 100 to ",
                settings.duration.count());
  settings.duration = std::chrono::milliseconds(ms);
  if (ms < 500) settings.size = 512;
  return settings;
}

}  // namespace

// What it gives, not what it has.
VolunteerProbe probeThisMachine(const VolunteerConfig& config) {
  MachineProbe measured;
  probeMemoryAndCores(&measured);
  VolunteerProbe probe;
  probe.ram_gb = measured.ram_gb;
  probe.cores = measured.cores;
  if (config.cores > 0 && config.cores < probe.cores) probe.cores = config.cores;
  if (config.memory_gb > 0 && config.memory_gb < probe.ram_gb) probe.ram_gb = config.memory_gb;
  if (probe.cores != measured.cores || probe.ram_gb != measured.ram_gb)
    CAIRN_INFO("probe: giving ", probe.cores, " of ", measured.cores, " cores and ",
               probe.ram_gb, " of ", measured.ram_gb, " GB (--cores, --memory-gb)");
  const ComputeProbeSettings compute = computeProbeSettings(config.relay_mbps.has_value());
  if (config.relay_mbps)
    CAIRN_INFO("probe: this volunteer only relays: its compute figure from ", compute.duration.count(),
               " ms of ", compute.size, " x ", compute.size, " sgemms");
  probe.compute_gflops = probeComputeGflops(compute.size, compute.duration, probe.cores);
  std::string no_gpus;
  probe.gpus = probeGpus(&no_gpus);
  if (probe.gpus.empty()) CAIRN_INFO("probe: GPUs: none (", no_gpus, ")");
  probe.libtorch = libtorchVersion();
  return probe;
}

namespace {

// The assigned node's run: binding --listen, peers dialling the advertised address.
ProviderRunOptions assignedRun(const VolunteerConfig& config, const VolunteerSession& session,
                               const AssignmentWait& wait, std::shared_ptr<SendPacer> pacer) {
  ProviderRunOptions run;
  run.send_pacer = std::move(pacer);
  run.node_data = wait.node_data;
  run.name = wait.name;
  run.bind_address = session.listenBound();
  run.same_host_links = false;  // CURVE over TCP even on loopback (ProviderRunOptions)
  run.resume = wait.resume;  // a restarted volunteer given its stage again: its checkpoints
  run.device = config.device;
  run.max_threads = config.cores;
  // data.source "coordinator": the Root fetches its cluster's chunks (node/volunteer/ServedChunks.h).
  run.chunk_source = std::make_shared<ServedChunks>(config.invite, session.workdir().loadOrCreateIdentity(),
                                                    wait.name, session.workdir().path() + "/chunks");
  return run;
}

// The coordinator's word, in answer to a heartbeat, that this volunteer's node was given to a spare
// while it was unreachable (frozen, cut off: rejected{node_taken}). Set on the heartbeats' thread,
// read by the run's stop predicate: the run stops (giving up a step whose neighbours no longer
// answer, MailboxStageLink) and the volunteer joins again, as a spare.
struct NodeTaken {
  std::atomic<bool> yes{false};
  void heard(const Rejected& rejected, const std::string& node) {
    if (!rejected.node_taken) {
      CAIRN_WARN("the coordinator refused a heartbeat: ", rejected.reason);
      return;
    }
    if (!yes.exchange(true))
      CAIRN_WARN("the coordinator says: ", rejected.reason, "; stopping ", node, "'s run");
  }
};

// Trains the assignment (again with resume after a neighbour was replaced by a spare) while
// heartbeats, checkpoint uploads and the metrics stream go on in the background; they are
// finished before it returns. On an error the coordinator hears `leaving` before it is rethrown.
ProviderRunOutcome trainAssignment(const VolunteerConfig& config, VolunteerSession& session,
                                   ProviderRunOptions& run, VolunteerPeers& peers,
                                   VolunteerMetrics& metrics, NodeTaken& taken) {
  ProviderRunOutcome outcome;
  auto heartbeats = session.trainingHeartbeats([m = &metrics] { return m->progress(); });
  auto uploads = session.checkpointUploads(nodeDirectory(run.node_data, run.name) + "/checkpoints");
  heartbeats->onPeers([&peers](const PeersUpdate& update) { peers.offer(update); });
  heartbeats->onRejected([&taken, node = run.name](const Rejected& r) { taken.heard(r, node); });
  if (uploads) run.keep_checkpoints_from = [u = uploads.get()] { return u->keepFrom(); };
  try {
    outcome = runProvider(run);
    while (outcome.stopped && !(config.stop_requested && config.stop_requested()) && !taken.yes &&
           peers.applyPending()) {
      run.resume = true;
      outcome = runProvider(run);
    }
  } catch (const std::exception& e) {
    uploads.reset();
    heartbeats.reset();
    metrics.finish(std::chrono::milliseconds(5000));  // the "lost-peer"/"failed" state
    session.sendLeaving(std::string("failed: ") + e.what());
    throw;
  }
  // The last checkpoint (written at the end of training, or at a stop) goes up first: before
  // the results, or before `leaving` (then for less time: a stop was asked for).
  if (uploads) uploads->finish(std::chrono::milliseconds(outcome.stopped ? 10000 : 30000));
  // Every record still queued goes up before the results (or `leaving`).
  if (!metrics.finish(std::chrono::milliseconds(outcome.stopped ? 10000 : 30000)))
    CAIRN_WARN("the coordinator did not take every metrics record; they are in the node's "
               "metrics.jsonl");
  return outcome;
}

// --memory-gb: an assignment whose stage needs more than the volunteer gives is refused (the
// coordinator planned with the probe's capped RAM, so only a coordinator that ignored it sends
// one). The coordinator hears why in `leaving`; BadInput (exit 2): restarting cannot help.
void checkAssignmentFits(const VolunteerConfig& config, VolunteerSession& session,
                         const AssignmentWait& wait) {
  if (config.memory_gb <= 0) return;
  const std::string path = nodeSpecPath(wait.node_data, wait.name);
  const std::string why = whyTooBigForVolunteer(readNodeSpec(path), config.memory_gb);
  if (why.empty()) return;
  session.sendLeaving(why);
  CAIRN_THROW(BadInput, why, " (", path, ", estimates.memory_bytes)");
}

// --active-hours: "HH:MM" of a minute of the day, for the log.
std::string clockText(int minute) {
  char text[8];
  std::snprintf(text, sizeof text, "%02d:%02d", minute / 60 % 24, minute % 60);
  return text;
}

// Whether the volunteer's active hours are over, asked between steps and at heartbeats: the clock
// read at most once a second, or every hours_poll when that is shorter (a test clock is a file,
// looked at every 0.2 s). Always false without --active-hours.
// Thread-safe (the trainer's thread and the peers' stop predicate may both ask).
std::function<bool()> hoursOverWatch(const VolunteerConfig& config) {
  if (!config.active_hours) return [] { return false; };
  struct State {
    std::mutex mutex;
    std::chrono::steady_clock::time_point next{};
    bool over = false;
  };
  auto state = std::make_shared<State>();
  const auto every = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), config.hours_poll);
  return [state, hours = *config.active_hours, clock = config.clock, every] {
    std::lock_guard<std::mutex> lock(state->mutex);
    const auto now = std::chrono::steady_clock::now();
    if (now >= state->next || state->over) {  // "over" is not kept: the next hours may begin
      state->over = !hours.contains(clock());
      state->next = now + every;
    }
    return state->over;
  };
}

std::string hoursOverReason(const VolunteerConfig& config) {
  return "its active hours " + config.active_hours->text() + " are over (local time " +
         clockText(config.clock()) + ")";
}

// --active-hours: outside them, waits (looking at the clock every hours_poll, seeing a stop
// within 100 ms) until they begin. False: stopped meanwhile.
bool waitForActiveHours(const VolunteerConfig& config) {
  if (!config.active_hours) return true;
  const auto stopped = [&] { return config.stop_requested && config.stop_requested(); };
  bool told = false;
  for (;;) {
    const int now = config.clock();
    if (config.active_hours->contains(now)) {
      if (told) CAIRN_INFO("active hours ", config.active_hours->text(), " begin (local time ",
                           clockText(now), "): joining");
      return true;
    }
    if (!told)
      CAIRN_INFO("outside the active hours ", config.active_hours->text(), " (local time ",
                 clockText(now), "): waiting ", config.active_hours->minutesUntilBegin(now),
                 " min for them to begin");
    told = true;
    const auto until = std::chrono::steady_clock::now() + config.hours_poll;
    while (std::chrono::steady_clock::now() < until) {
      if (stopped()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

// This volunteer's own running total of what it gave, from its trainer's step records (the
// coordinator keeps the run's record: coordinator/Credit.h): per node it held, its steps, rolled
// back by a resume exactly as the coordinator does. Thread-safe (records come from the trainer's
// thread).
class OwnCredit {
 public:
  void record(const std::string& node, const nlohmann::json& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& steps = nodes_[node];
    if (r.contains("resumed_from") && r["resumed_from"].is_number_integer()) {
      steps.erase(steps.upper_bound(r["resumed_from"].get<int64_t>()), steps.end());
    } else if (r.contains("step") && r["step"].is_number_integer()) {
      Figures& f = steps[r["step"].get<int64_t>()];
      f.samples = r.value("samples", int64_t(0));
      f.compute_s = r.value("compute_s", 0.0);
      f.sent_bytes = r.value("sent_bytes", int64_t(0));
    }
  }
  void print() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [node, steps] : nodes_) {
      Figures total;
      for (const auto& [step, f] : steps) {
        total.samples += f.samples;
        total.compute_s += f.compute_s;
        total.sent_bytes += f.sent_bytes;
      }
      char text[200];
      std::snprintf(text, sizeof text, "%zu steps, %lld samples, %.1f compute s, %.1f MB sent",
                    steps.size(), static_cast<long long>(total.samples), total.compute_s,
                    double(total.sent_bytes) / 1e6);
      CAIRN_INFO("this volunteer gave ", node, ": ", text, " (the coordinator's record of what the "
                 "run kept: run_result.json \"credit\")");
    }
  }

 private:
  struct Figures {
    int64_t samples = 0;
    double compute_s = 0;
    int64_t sent_bytes = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::string, std::map<int64_t, Figures>> nodes_;
};

enum class AfterAssignment { kExit, kNextHours, kJoinAgain };

// A test hook, off unless the environment asks for it: CAIRN_TEST_CRASH_BEFORE_RESULT=STAGE
// SIGKILLs the volunteer whose node is that stage (0: the Root) once it has finished training and
// its final checkpoint is uploaded, just before its result would go up: a machine lost at that
// moment (tests/integration/volunteer_churn_test.py lost_after_finishing).
void testCrashBeforeResult(const std::string& node_data, const std::string& name) {
  const char* value = std::getenv("CAIRN_TEST_CRASH_BEFORE_RESULT");
  if (value == nullptr || *value == '\0') return;
  if (std::to_string(readNodeSpec(nodeSpecPath(node_data, name)).stage) != value) return;
  CAIRN_WARN("CAIRN_TEST_CRASH_BEFORE_RESULT=", value, ": killing this volunteer before its result goes up");
  std::raise(SIGKILL);
}

// Trains one assignment to its end (results uploaded) or until this volunteer stops: a signal
// (it says `leaving` and exits) or the end of its active hours (it says `leaving` and waits for
// the next ones). Either way its node is handed over: the rest of its cluster, stopped at the
// same step with a checkpoint, waits for a spare to take the node (NodeRunner).
AfterAssignment serveAssignment(const VolunteerConfig& config, VolunteerSession& session,
                                const AssignmentWait& wait, const std::function<bool()>& hours_over,
                                OwnCredit& own, const std::shared_ptr<SendPacer>& pacer) {
  checkAssignmentFits(config, session, wait);
  ProviderRunOptions run = assignedRun(config, session, wait, pacer);
  // A neighbour replaced by a spare: the paused run stops and runs again with the new peers.
  VolunteerPeers peers(run.node_data, run.name, session.publicKey(), describeCoordinator(config.invite));
  const auto signal = config.stop_requested;
  auto taken = std::make_shared<NodeTaken>();
  run.stop_requested = peers.stopWhenReplaced([signal, hours_over, taken] {
    return (signal && signal()) || hours_over() || taken->yes;
  });
  run.stop_hands_over = true;
  run.on_live_peers = peers.liveHook();  // a ring peer replaced: re-pointed live
  run.neighbour_replaced = peers.replacedHook();  // a neighbour replaced: its wait ends
  // The trainer's records, plan and state changes go to the coordinator in the background.
  auto metrics = session.metricsStream();
  run.on_record = [m = metrics.get(), &own, node = wait.name](const nlohmann::json& r, const std::string& line) {
    own.record(node, r);
    m->record(r, line);
  };
  run.on_event = [m = metrics.get()](const nlohmann::json& e) { m->event(e); };
  run.on_event = peers.watch(run.on_event);  // notes "paused"
  const ProviderRunOutcome outcome = trainAssignment(config, session, run, peers, *metrics, *taken);
  if (outcome.stopped && taken->yes && !(signal && signal())) {
    CAIRN_INFO("gave ", wait.name, " up (the coordinator gave it to a spare); joining again");
    session.forgetNode();
    return AfterAssignment::kJoinAgain;
  }
  if (outcome.stopped) {
    const bool off_hours = !(signal && signal()) && hours_over();
    session.sendLeaving(off_hours ? hoursOverReason(config) : std::string("stopped"));
    return off_hours ? AfterAssignment::kNextHours : AfterAssignment::kExit;
  }
  testCrashBeforeResult(run.node_data, run.name);
  if (!session.uploadResult(outcome.summary, outcome.weights_path))
    CAIRN_WARN("the coordinator at ", config.invite.address(),
               " did not acknowledge the results; they stay in ", outcome.result_path, " and ",
               outcome.weights_path);
  return AfterAssignment::kExit;
}

}  // namespace

int runVolunteer(const VolunteerConfig& config) {
  setLogTag("volunteer");
  VolunteerSession session(config);
  session.startResponder();  // a --listen that cannot be bound fails before the probe
  const VolunteerProbe machine = probeThisMachine(config);
  const std::function<bool()> hours_over = hoursOverWatch(config);
  OwnCredit own;
  // --max-mbps: the training transport's share of it, one schedule for every assignment.
  std::shared_ptr<SendPacer> pacer;
  if (config.max_mbps > 0) {
    const double training_mbps = config.max_mbps - config.upload_mbps;
    pacer = std::make_shared<SendPacer>(
        training_mbps, std::max<uint64_t>(256 << 10, uint64_t(training_mbps * 1e6 / 8 * 0.1)));
    CAIRN_INFO("sends capped at ", config.max_mbps, " Mbit/s (--max-mbps): ", training_mbps,
               " for training, ", config.upload_mbps, " for checkpoint uploads");
  }
  for (;;) {
    if (!waitForActiveHours(config)) {
      CAIRN_INFO("stopped outside the active hours");
      return 0;
    }
    const auto accepted = session.join(machine);
    if (!accepted) {
      CAIRN_INFO("stopped before the coordinator answered");
      return 0;
    }
    setLogTag(session.name());
    const AssignmentWait wait =
        session.waitForAssignment(hours_over, [&config] { return hoursOverReason(config); });
    if (wait.end == AssignmentWait::End::kLeft) {
      setLogTag("volunteer");
      continue;  // its active hours are over: wait for the next ones
    }
    if (wait.end == AssignmentWait::End::kStopped) {
      CAIRN_INFO("stopped while waiting for an assignment");
      return 0;
    }
    if (wait.end == AssignmentWait::End::kFinished) {
      CAIRN_INFO("the coordinator says the run is over (", wait.reason, "); nothing to train");
      return 0;
    }
    const AfterAssignment after = serveAssignment(config, session, wait, hours_over, own, pacer);
    own.print();
    if (after == AfterAssignment::kExit) return 0;
    setLogTag("volunteer");
  }
}

}  // namespace cairn
