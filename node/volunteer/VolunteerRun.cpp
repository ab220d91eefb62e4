#include "node/volunteer/VolunteerRun.h"

#include "core/Log.h"
#include "core/NodeData.h"
#include "core/TorchCompat.h"
#include "node/volunteer/Probe.h"
#include "node/pipeline/ProviderRun.h"
#include "node/volunteer/ServedChunks.h"
#include "node/volunteer/VolunteerAssignment.h"
#include "node/volunteer/VolunteerPeers.h"

namespace cairn {
namespace {

// This machine's RAM, cores, GFLOPS, GPUs and libtorch version for the join (the bandwidth is
// measured by the session), within the volunteer's limits (--cores, --memory-gb): what it gives,
// not what it has.
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
  probe.compute_gflops = probeComputeGflops(1024, std::chrono::milliseconds(1500), probe.cores);
  std::string no_gpus;
  probe.gpus = probeGpus(&no_gpus);
  if (probe.gpus.empty()) CAIRN_INFO("probe: GPUs: none (", no_gpus, ")");
  probe.libtorch = libtorchVersion();
  return probe;
}

// The assigned node's run: binding --listen, peers dialling the advertised address.
ProviderRunOptions assignedRun(const VolunteerConfig& config, const VolunteerSession& session,
                               const AssignmentWait& wait) {
  ProviderRunOptions run;
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

// Trains the assignment (again with resume after a neighbour was replaced by a spare) while
// heartbeats, checkpoint uploads and the metrics stream go on in the background; they are
// finished before it returns. On an error the coordinator hears `leaving` before it is rethrown.
ProviderRunOutcome trainAssignment(const VolunteerConfig& config, VolunteerSession& session,
                                   ProviderRunOptions& run, VolunteerPeers& peers,
                                   VolunteerMetrics& metrics) {
  ProviderRunOutcome outcome;
  auto heartbeats = session.trainingHeartbeats([m = &metrics] { return m->progress(); });
  auto uploads = session.checkpointUploads(nodeDirectory(run.node_data, run.name) + "/checkpoints");
  heartbeats->onPeers([&peers](const PeersUpdate& update) { peers.offer(update); });
  if (uploads) run.keep_checkpoints_from = [u = uploads.get()] { return u->keepFrom(); };
  try {
    outcome = runProvider(run);
    while (outcome.stopped && !(config.stop_requested && config.stop_requested()) &&
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

}  // namespace

int runVolunteer(const VolunteerConfig& config) {
  setLogTag("volunteer");
  VolunteerSession session(config);
  session.startResponder();  // a --listen that cannot be bound fails before the probe
  const auto accepted = session.join(probeThisMachine(config));
  if (!accepted) {
    CAIRN_INFO("stopped before the coordinator answered");
    return 0;
  }
  setLogTag(session.name());
  const AssignmentWait wait = session.waitForAssignment();
  if (wait.end == AssignmentWait::End::kStopped) {
    CAIRN_INFO("stopped while waiting for an assignment");
    return 0;
  }
  if (wait.end == AssignmentWait::End::kFinished) {
    CAIRN_INFO("the coordinator says the run is over (", wait.reason, "); nothing to train");
    return 0;
  }
  checkAssignmentFits(config, session, wait);
  ProviderRunOptions run = assignedRun(config, session, wait);
  // A neighbour replaced by a spare: the paused run stops and runs again with the new peers.
  VolunteerPeers peers(run.node_data, run.name, session.publicKey(), describeCoordinator(config.invite));
  run.stop_requested = peers.stopWhenReplaced(config.stop_requested);
  run.on_live_peers = peers.liveHook();  // a ring peer replaced: re-pointed live
  // The trainer's records, plan and state changes go to the coordinator in the background.
  auto metrics = session.metricsStream();
  run.on_record = [m = metrics.get()](const nlohmann::json& r, const std::string& line) { m->record(r, line); };
  run.on_event = [m = metrics.get()](const nlohmann::json& e) { m->event(e); };
  run.on_event = peers.watch(run.on_event);  // notes "paused"
  const ProviderRunOutcome outcome = trainAssignment(config, session, run, peers, *metrics);
  if (outcome.stopped) {
    session.sendLeaving("stopped");
    return 0;
  }
  if (!session.uploadResult(outcome.summary, outcome.weights_path))
    CAIRN_WARN("the coordinator at ", config.invite.address(),
               " did not acknowledge the results; they stay in ", outcome.result_path, " and ",
               outcome.weights_path);
  return 0;
}

}  // namespace cairn
