// provider: the one binary a volunteer runs. See `provider --help` and docs/THREADS.md.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <set>
#include <pthread.h>
#include <cstring>
#include <thread>

#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/MainGuard.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"
#include "node/MailboxStageLink.h"
#include "node/NodeRunner.h"
#include "node/Probe.h"
#include "node/RingClusterSync.h"
#include "node/NodeSecurity.h"
#include "node/ZmqTransport.h"
#include "trainer/StageExecutor.h"
#include "trainer/StageTrainer.h"

namespace {

// How many clusters train this job: node.json extra.num_clusters when clusterize wrote it, else the
// plan's cluster list, else the distinct clusters of the node folders present, else 1.
int countClusters(const std::string& node_data, const cairn::NodeSpec& node) {
  if (node.extra.contains("num_clusters") && node.extra["num_clusters"].is_number_integer())
    return std::max(1, node.extra["num_clusters"].get<int>());
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(cairn::planPath(node_data), ec)) {
    const nlohmann::json plan = cairn::readJsonFile(cairn::planPath(node_data));
    if (plan.contains("num_clusters") && plan["num_clusters"].is_number_integer())
      return std::max(1, plan["num_clusters"].get<int>());
    if (plan.contains("clusters") && plan["clusters"].is_array() && !plan["clusters"].empty())
      return int(plan["clusters"].size());
  }
  std::set<int> clusters{node.cluster};
  for (const auto& entry : fs::directory_iterator(node_data + "/nodes", ec)) {
    const std::string spec = entry.path().string() + "/node.json";
    if (!fs::exists(spec, ec)) continue;
    try {
      clusters.insert(cairn::readNodeSpec(spec).cluster);
    } catch (const cairn::Error&) {
    }
  }
  return int(clusters.size());
}

// SIGINT/SIGTERM: the first asks for a clean stop (the trainer stops the cluster at a step boundary
// and checkpoints); a second exits at once. Both are blocked in every thread (set before any thread
// starts, so ZeroMQ's, the ZAP handler's and torch's threads inherit it) and taken by one thread in
// sigwait(), which sets the flag and wakes the main thread with SIGUSR1 (a no-op handler installed
// without SA_RESTART): the main thread's blocking wait returns with EINTR and reads the flag.
std::atomic<bool> g_stop{false};
extern "C" void onWake(int) {}
void installStopHandling() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  struct sigaction wake {};
  wake.sa_handler = onWake;
  sigemptyset(&wake.sa_mask);
  wake.sa_flags = 0;
  sigaction(SIGUSR1, &wake, nullptr);
  const pthread_t main_thread = pthread_self();
  std::thread([stop_signals, main_thread] {
    for (int count = 0;; ++count) {
      int sig = 0;
      if (sigwait(&stop_signals, &sig) != 0) continue;
      if (count >= 1) {
        std::fprintf(stderr, "provider: second signal (%s), exiting at once\n", strsignal(sig));
        std::_Exit(128 + sig);
      }
      CAIRN_WARN("signal ", strsignal(sig), ": stopping at the next step boundary (again to exit at once)");
      g_stop = true;
      pthread_kill(main_thread, SIGUSR1);
    }
  }).detach();
}

torch::jit::Module loadStage(const std::string& path) {
  try {
    return torch::jit::load(path);
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, path, ": cannot load the TorchScript stage: ",
                std::string(e.what_without_backtrace()).substr(0, 300));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "provider: run one node of a cairn plan: load nodes/<name>/{node.json,stage.pt} and "
      "job.json,\n"
      "connect to the pipeline neighbours, train, evaluate, and write "
      "nodes/<name>/trained_stage.pt\n"
      "and nodes/<name>/metrics.jsonl.\n\n"
      "Failures (docs/OPERATIONS.md): with training_definition.checkpoint_every > 0 each node\n"
      "checkpoints into nodes/<name>/checkpoints/. A pipeline neighbour lost mid-run (connection\n"
      "down for timeouts.peer_timeout_s) pauses the cluster; it continues when the node is\n"
      "restarted with --resume, or exits 3 after timeouts.max_wait_s naming it.\n"
      "SIGINT/SIGTERM: stop at a step boundary, checkpoint, tell the neighbours, exit 0 (the\n"
      "whole cluster stops; restart every node with --resume). A second signal exits at once."};
  std::string name;
  std::string node_data = "node_data";
  app.add_option("--name", name, "node name as in node_data/nodes/ (e.g. node_3); required to train");
  app.add_option("--node-data", node_data, "folder written by clusterize")->capture_default_str();
  // Know your machine: print this machine's node_configs.json entry (tools/make_node_configs
  // gathers them), measuring bandwidth against a peer running --probe-serve, or loopback.
  bool probe = false;
  std::string probe_address = "127.0.0.1:5500", probe_peer, probe_serve;
  int probe_megabytes = 256;
  app.add_flag("--probe", probe,
               "print this machine's node_configs.json entry: RAM and cores (hwloc, cgroup limit "
               "applied), matmul GFLOPS, bandwidth (Mbps) to --peer or over loopback");
  app.add_option("--address", probe_address, "with --probe: the IP (host:port) to write in the entry")
      ->capture_default_str();
  app.add_option("--peer", probe_peer, "with --probe: host:port of a `provider --probe-serve`");
  app.add_option("--probe-megabytes", probe_megabytes, "with --probe: MiB sent to measure bandwidth")
      ->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--probe-serve", probe_serve,
                 "serve bandwidth probes on host:port until interrupted (for --probe --peer)");
  bool resume = false;
  app.add_flag("--resume", resume,
               "restart from the newest step for which every node of this cluster has a valid\n"
               "checkpoint (nodes/<name>/checkpoints/; the nodes agree on it over the wire). When\n"
               "the cluster holds no common checkpoint the node starts from step 0 with a warning");
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "talk plain TCP without CurveZMQ: no encryption, anyone who reaches the port can "
               "send tensors.\nFor local debugging and plans without keys only; by default the "
               "node reads nodes/<name>/secret.key\nand admits only the public keys of its "
               "neighbours and ring peers listed in its node.json");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (probe || !probe_serve.empty()) {
    return cairn::runGuarded("provider", [&] {
      if (!probe_serve.empty()) {
        std::string host;
        int port = 0;
        cairn::parseHostPort(probe_serve, "command line", "--probe-serve", &host, &port);
        cairn::serveBandwidthProbes(probe_serve);
        return 0;
      }
      std::string host;
      int port = 0;
      cairn::parseHostPort(probe_address, "command line", "--address", &host, &port);
      if (!probe_peer.empty()) cairn::parseHostPort(probe_peer, "command line", "--peer", &host, &port);
      cairn::MachineProbe measured;
      cairn::probeMemoryAndCores(&measured);
      measured.compute_gflops = cairn::probeComputeGflops();
      measured.bandwidth_mbps = cairn::probeBandwidthMbps(
          probe_peer.empty() ? std::nullopt : std::optional<std::string>(probe_peer), probe_megabytes);
      std::printf("%s\n", cairn::nodeConfigEntry(measured, probe_address).dump(2).c_str());
      return 0;
    });
  }
  if (name.empty()) {
    std::fprintf(stderr, "provider: error: --name is required (or --probe / --probe-serve)\n");
    return 2;
  }
  installStopHandling();  // before any thread starts
  return cairn::runGuarded("provider", [&] {
    cairn::setLogTag(name);
    const std::string job_path = cairn::jobSpecPath(node_data);
    const cairn::NodeSpec node = cairn::readNodeSpec(cairn::nodeSpecPath(node_data, name));
    const cairn::JobSpec job = cairn::readJobSpec(job_path);
    if (node.name != name)
      CAIRN_THROW(BadInput, cairn::nodeSpecPath(node_data, name), ": name is \"", node.name,
                  "\", not \"", name, "\"");
    if (node.job_id != job.job_id)
      CAIRN_THROW(BadInput, cairn::nodeSpecPath(node_data, name), ": job_id \"", node.job_id,
                  "\" differs from job.json's \"", job.job_id, "\"");
    cairn::StageTrainerConfig config;
    config.node = node;
    config.options = cairn::parseTrainOptions(job.training, job_path);
    config.data = cairn::parseDataOptions(job.data, job_path);
    config.num_clusters = countClusters(node_data, node);
    const std::string dir = cairn::nodeDirectory(node_data, name);
    config.metrics_path = dir + "/metrics.jsonl";
    config.sample_ids_path = dir + "/sample_ids.jsonl";
    // Always set: a stop (signal) checkpoints even when checkpoint_every is 0; periodic
    // checkpoints (and so pausing on a lost neighbour) need checkpoint_every > 0.
    config.checkpoint_dir = dir + "/checkpoints";
    config.stop_requested = [] { return g_stop.load(); };
    at::set_num_threads(config.options.threads);
    at::set_num_interop_threads(1);

    torch::jit::Module stage = loadStage(dir + "/" + node.stage_file);  // checked here; the
    // runner loads it afresh for every attempt
    // What pipeline messages may look like (MailboxStageLink checks every one).
    cairn::LinkChecks checks;
    checks.max_microbatch_rows = (config.options.batch_size + config.options.microbatches - 1) /
                                 config.options.microbatches;
    checks.max_eval_rows = config.options.eval_batch_size;
    checks.step_window = uint64_t(config.options.step_window);
    checks.stop_on_nonfinite = config.options.nonfinite == cairn::NonFiniteAction::kStop;
    // ZMQ_MAXMSGSIZE: the largest planned message, pipeline or ring (parameters of this stage).
    uint64_t parameter_bytes = 0;
    for (const auto& p : stage.named_parameters()) parameter_bytes += p.value.nbytes();
    for (const auto& b : stage.named_buffers()) parameter_bytes += b.value.nbytes();
    zmq::context_t context;
    cairn::TransportOptions transport_options;
    transport_options.codec.max_message_bytes =
        std::max(cairn::plannedMessageBytes(node, checks), parameter_bytes + (1u << 20));
    std::unique_ptr<cairn::ZapAuthenticator> authenticator;  // before the transport, outlives it
    if (insecure) {
      CAIRN_WARN("--insecure: CurveZMQ is off; messages are neither encrypted nor authenticated "
                 "and anyone who can reach ", node.address, " can talk to this node");
    } else {
      transport_options.curve = cairn::curveOptionsForNode(
          node, cairn::nodeSpecPath(node_data, name), dir + "/" + cairn::kSecretKeyFile);
      authenticator = std::make_unique<cairn::ZapAuthenticator>(
          context, cairn::admittedKeys(*transport_options.curve));
      CAIRN_INFO("CurveZMQ on: admitting ", transport_options.curve->peer_public_keys.size(),
                 " peer keys");
    }
    cairn::ZmqTransport transport(context, name, "tcp://" + node.address, transport_options);
    cairn::Mailbox mailbox(transport);
    CAIRN_INFO("job ", job.job_id, ": cluster ", node.cluster, " of ", config.num_clusters,
               ", stage ", node.stage + 1, "/", node.num_stages, " (", cairn::toString(node.role),
               "), listening on ", node.address);
    cairn::LinkTimeouts timeouts;
    timeouts.startup = std::chrono::milliseconds(int64_t(config.options.timeouts.startup_s * 1000));
    timeouts.peer = std::chrono::milliseconds(int64_t(config.options.timeouts.peer_s * 1000));
    timeouts.lost = std::chrono::milliseconds(int64_t(config.options.timeouts.peer_timeout_s * 1000));
    // Ring members (other clusters) become transport peers before the pipeline handshake; the
    // first collective (the initial-weights check) waits for late members up to this timeout.
    cairn::RingClusterSync cluster_sync(mailbox, node, config.options.sync,
                                        config.options.local_steps,
                                        std::max(timeouts.startup, timeouts.peer));
    config.cluster_sync = &cluster_sync;
    cairn::MailboxStageLink link(mailbox, node, timeouts, checks);
    cairn::NodeRunnerConfig run_config;
    run_config.trainer = config;
    run_config.stage_path = dir + "/" + node.stage_file;
    run_config.node_data = node_data;
    run_config.resume = resume;
    run_config.max_wait = std::chrono::milliseconds(int64_t(config.options.timeouts.max_wait_s * 1000));
    stage = torch::jit::Module();
    cairn::NodeRunner runner(run_config, mailbox, link, &cluster_sync);
    const cairn::NodeRunResult run = runner.run();
    const cairn::TrainerResult& result = run.result;
    const std::string weights = dir + "/trained_stage.pt";
    nlohmann::json summary = {{"steps", result.steps},
                              {"last_loss", result.last_loss},
                              {"seconds", result.seconds},
                              {"train_samples_per_s", result.samples_per_second},
                              {"stopped", result.stopped},
                              {"pauses", run.pauses},
                              {"resumed_from", run.resumed_from}};
    if (!result.stopped) {  // a stopped run's state is in its checkpoint
      runner.trainer().executor().module().save(weights + ".tmp");
      std::filesystem::rename(weights + ".tmp", weights);
      summary["weights"] = weights;
    }
    if (result.final_eval) {
      summary["eval"] = {{"samples", result.final_eval->samples},
                         {"loss", result.final_eval->loss},
                         {"accuracy", result.final_eval->accuracy},
                         {"perplexity", result.final_eval->perplexity}};
    }
    const cairn::TransportStats stats = transport.stats();
    summary["transport"] = {{"messages_received", stats.messages_received},
                            {"messages_dropped", stats.messages_dropped},
                            {"messages_forged", stats.messages_forged},
                            {"curve", !insecure},
                            {"connections_refused", authenticator ? authenticator->rejected() : 0},
                            {"pipeline_accepted", link.stats().accepted},
                            {"pipeline_dropped", link.stats().dropped}};
    cairn::writeJsonFile(dir + "/result.json", summary);
    if (result.stopped)
      CAIRN_INFO("stopped: ", result.steps, " steps; resume with `provider --name ", name,
                 " --node-data ", node_data, " --resume`");
    else
      CAIRN_INFO("done: ", result.steps, " steps in ", result.seconds, " s; trained weights in ",
                 weights);
    transport.flushAndClose(std::chrono::milliseconds(5000));
    CAIRN_INFO("transport: ", stats.messages_received, " messages received, ",
               stats.messages_dropped, " dropped (", stats.messages_forged, " forged)",
               authenticator ? ", " + std::to_string(authenticator->rejected()) +
                                   " connections refused" : std::string());
    return 0;
  });
}
