#include "node/pipeline/ProviderRun.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>

#include "core/BlasThreads.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/NodeData.h"
#include "node/transport/LivePeers.h"
#include "node/pipeline/MailboxStageLink.h"
#include "node/pipeline/NodeRunner.h"
#include "node/pipeline/TestHold.h"
#include "node/transport/NodeSecurity.h"
#include "node/ring/RingClusterSync.h"
#include "node/transport/ZmqTransport.h"
#include "trainer/DealSampler.h"
#include "trainer/Device.h"
#include "trainer/SharedParameters.h"
#include "trainer/StageExecutor.h"
#include "trainer/StageTrainer.h"

namespace cairn {
namespace {

// How many clusters train this job: node.json extra.num_clusters when clusterize (or the
// coordinator) wrote it, else the plan's cluster list, else the distinct clusters of the node
// folders present, else 1.
int countClusters(const std::string& node_data, const NodeSpec& node) {
  if (node.extra.contains("num_clusters") && node.extra["num_clusters"].is_number_integer())
    return std::max(1, node.extra["num_clusters"].get<int>());
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(planPath(node_data), ec)) {
    const nlohmann::json plan = readJsonFile(planPath(node_data));
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
      clusters.insert(readNodeSpec(spec).cluster);
    } catch (const Error&) {
    }
  }
  return int(clusters.size());
}

// node.json extra.deal, the deal in force (null when absent).
nlohmann::json dealOf(const NodeSpec& node) {
  return node.extra.is_object() && node.extra.contains("deal") ? node.extra["deal"] : nlohmann::json();
}

// The deal a growth update offers: extra.offered_deal while the Roots decide (coordinator/
// Grower.h), extra.deal once every Root took it (null when neither).
nlohmann::json offeredDealOf(const NodeSpec& node) {
  if (node.extra.is_object() && node.extra.contains("offered_deal")) return node.extra["offered_deal"];
  return dealOf(node);
}

// node.json and job.json belong together: the node's name and job id.
void checkNodeOfJob(const NodeSpec& node, const JobSpec& job, const std::string& spec_path,
                    const std::string& name) {
  if (node.name != name)
    CAIRN_THROW(BadInput, spec_path, ": name is \"", node.name, "\", not \"", name, "\"");
  if (node.job_id != job.job_id)
    CAIRN_THROW(BadInput, spec_path, ": job_id \"", node.job_id, "\" differs from job.json's \"",
                job.job_id, "\"");
}

// The trainer's configuration: job.json's training definition and data, the node's files in
// `dir`, the run's hooks from `options`.
StageTrainerConfig trainerConfig(const ProviderRunOptions& options, const NodeSpec& node,
                                 const JobSpec& job, const std::string& job_path,
                                 const std::string& dir) {
  StageTrainerConfig config;
  config.node = node;
  config.options = parseTrainOptions(job.training, job_path);
  checkSharedParameters(node, config.options, job_path);
  config.data = parseDataOptions(job.data, job_path);
  config.num_clusters = countClusters(options.node_data, node);
  config.metrics_path = dir + "/metrics.jsonl";
  config.sample_ids_path = dir + "/sample_ids.jsonl";
  // Always set: a stop (signal) checkpoints even when checkpoint_every is 0; periodic
  // checkpoints (and so pausing on a lost neighbour) need checkpoint_every > 0.
  config.checkpoint_dir = dir + "/checkpoints";
  config.keep_checkpoints_from = options.keep_checkpoints_from;
  config.stop_requested = options.stop_requested;
  config.stop_hands_over = options.stop_hands_over;
  config.chunk_source = options.chunk_source;  // data.source "coordinator" (provider --join)
  config.placement = makePlacement(resolveDevice(options.device, "--device"));
  return config;
}

void setTorchThreads(int threads) {
  at::set_num_threads(threads);
  setBlasThreads(1);  // one BLAS thread, whatever `threads` says: core/BlasThreads.h says why
  // Once per process: libtorch refuses it after parallel work started (provider --join runs its
  // stage again in-process after a peer was replaced, node/volunteer/VolunteerPeers.h).
  static std::once_flag interop_threads_set;
  std::call_once(interop_threads_set, [] { at::set_num_interop_threads(1); });
}

// What pipeline messages may look like (MailboxStageLink checks every one).
LinkChecks linkChecks(const TrainOptions& train, const std::string& job_path) {
  LinkChecks checks;
  checks.max_microbatch_rows = (train.batch_size + train.microbatches - 1) / train.microbatches;
  checks.max_eval_rows = train.eval_batch_size;
  checks.step_window = uint64_t(train.step_window);
  checks.stop_on_nonfinite = train.nonfinite == NonFiniteAction::kStop;
  checks.wire_float = stageWireDtype(toString(train.wire.activations), job_path);
  // __targets, __ids, __denominator, __stop_at, __stop_kind, __epoch_steps
  checks.max_extra_tensors = 6;
  return checks;
}

// The transport's settings but CURVE (secureTransport).
TransportOptions transportOptions(const ProviderRunOptions& options, const NodeSpec& node,
                                  const LinkChecks& checks, const torch::jit::Module& stage) {
  // ZMQ_MAXMSGSIZE: the largest planned message, pipeline or ring (parameters of this stage).
  uint64_t parameter_bytes = 0;
  for (const auto& p : stage.named_parameters()) parameter_bytes += p.value.nbytes();
  for (const auto& b : stage.named_buffers()) parameter_bytes += b.value.nbytes();
  TransportOptions transport_options;
  transport_options.codec.max_message_bytes =
      std::max(plannedMessageBytes(node, checks), parameter_bytes + (1u << 20));
  // Neighbours and ring peers on this host (loopback addresses) over a Unix-domain socket in this
  // user's 0700 directory instead of CURVE over TCP (docs/PROTOCOL.md "Same-host links").
  if (options.same_host_links) transport_options.same_host_dir = sameHostDir();
  // Behind a home router (node.json "dial_out_only"): this node listens on nothing and dials every
  // peer; a reachable node accepts dial-out-only peers at its port + 1 (ReversedLinks.h).
  transport_options.dial_out_only = node.dial_out_only;
  if (!node.dial_out_only) {
    transport_options.advertised_endpoint = "tcp://" + node.address;
    transport_options.accept_endpoint = acceptEndpointOf(
        "tcp://" + (options.bind_address.empty() ? node.address : options.bind_address));
  }
  transport_options.pacer = options.send_pacer;
  if (options.send_pacer)
    CAIRN_INFO("what this node sends is capped at ", options.send_pacer->mbps(), " Mbit/s (--max-mbps)");
  return transport_options;
}

// CurveZMQ unless --insecure: the node's keys into `transport_options`, and the ZAP authenticator
// that admits its peers' keys (null with --insecure). It must be made before the transport and
// outlive it.
std::unique_ptr<ZapAuthenticator> secureTransport(const ProviderRunOptions& options,
                                                  const NodeSpec& node, const std::string& dir,
                                                  zmq::context_t& context,
                                                  TransportOptions* transport_options) {
  if (options.insecure) {
    CAIRN_WARN("--insecure: CurveZMQ is off; messages are neither encrypted nor authenticated "
               "and anyone who can reach ", node.address, " can talk to this node");
    return nullptr;
  }
  transport_options->curve = curveOptionsForNode(node, nodeSpecPath(options.node_data, options.name),
                                                 dir + "/" + kSecretKeyFile);
  auto authenticator =
      std::make_unique<ZapAuthenticator>(context, admittedKeys(*transport_options->curve));
  CAIRN_INFO("CurveZMQ on: admitting ", transport_options->curve->peer_public_keys.size(),
             " peer keys");
  return authenticator;
}

void logListening(const JobSpec& job, const NodeSpec& node, int num_clusters,
                  const std::string& bind) {
  CAIRN_INFO("job ", job.job_id, ": cluster ", node.cluster, " of ", num_clusters,
             ", stage ", node.stage + 1, "/", node.num_stages, " (", toString(node.role), "), ",
             node.dial_out_only ? "dial-out only: listening on nothing, dialling every peer"
                                : "listening on " + bind,
             bind == node.address || node.dial_out_only ? std::string()
                                                        : " (peers dial " + node.address + ")");
}

LinkTimeouts linkTimeouts(const TimeoutOptions& t) {
  LinkTimeouts timeouts;
  timeouts.startup = std::chrono::milliseconds(int64_t(t.startup_s * 1000));
  timeouts.peer = std::chrono::milliseconds(int64_t(t.peer_s * 1000));
  timeouts.lost = std::chrono::milliseconds(int64_t(t.peer_timeout_s * 1000));
  timeouts.connected = std::chrono::milliseconds(int64_t(t.max_wait_s * 1000));
  return timeouts;
}

// "gradients": job.json sync.bucket_bytes and sync.overlap (RingClusterSync.h
// GradientSyncOptions; the same job.json on every member, so every ring cuts the same buckets).
GradientSyncOptions gradientSync(const SyncOptions& sync) {
  GradientSyncOptions gradient_sync;
  gradient_sync.bucket_bytes = sync.bucket_bytes;
  gradient_sync.overlap = sync.overlap;
  if (sync.mode == SyncMode::kGradients)
    CAIRN_INFO("gradients: buckets of at most ", gradient_sync.bucket_bytes, " bytes, all-reduce ",
               gradient_sync.overlap ? "overlapped with the last backward" : "after backward");
  return gradient_sync;
}

// Withdraws the live-peers hook (provider --join) when the run ends, also by an exception.
struct WithdrawLivePeers {
  const ProviderRunOptions& o;
  ~WithdrawLivePeers() {
    if (o.on_live_peers) o.on_live_peers({});
  }
};

// A growth update (docs/OPERATIONS.md "Growing") also brings a new extra.deal: the Root takes it
// between steps (trainer/DealChange.h) and the rings take the new members in at the new
// cluster's first step, not before.
struct OfferedDeal {
  std::mutex mutex;
  std::optional<nlohmann::json> deal;  // under mutex
};

// What the Root proposes from the start (startingOffer); the plan follows the deal in force
// (extra.deal).
std::shared_ptr<OfferedDeal> pendingOffer(const NodeSpec& node) {
  auto offered = std::make_shared<OfferedDeal>();
  offered->deal = startingOffer(node);
  return offered;
}

// provider --join's peers update, applied live: re-pointed transport peers, new ring members
// (at the new cluster's first step when the update grows the run), the offered deal.
LivePeersApply livePeersHook(LivePeers& live_peers, RingClusterSync& cluster_sync,
                             std::shared_ptr<OfferedDeal> offered, const NodeSpec& node) {
  return [&live_peers, &cluster_sync, offered, started_with = dealOf(node)](const NodeSpec& updated) {
    const nlohmann::json deal = offeredDealOf(updated);
    const bool grows = !deal.is_null() && deal != started_with;
    std::vector<std::string> repointed;
    std::vector<std::string> changed = live_peers.apply(updated, &repointed);
    cluster_sync.markReplaced(repointed);  // their old processes are gone: stop waiting on them
    for (const std::string& added : cluster_sync.addMembers(updated, grows))
      changed.push_back(added + (grows ? " joins the rings at the new cluster's first step"
                                       : " joins the rings"));
    if (grows) {
      std::lock_guard<std::mutex> lock(offered->mutex);
      offered->deal = deal;
    }
    return changed;
  };
}

// The Root that takes an offered deal writes it into its own node.json as the deal in force
// (a restart before the coordinator's next update then plans with it, not with the old one).
// The coordinator's update after every Root took it says the same (VolunteerPeers writes it).
std::function<void(const nlohmann::json&, const std::string&)> recordTakingDeals(
    const ProviderRunOptions& options, const std::string& spec_path) {
  return [&options, spec_path](const nlohmann::json& record, const std::string& line) {
    if (record.is_object() && record.contains("deal") && record["deal"].is_object() &&
        record["deal"].value("accepted", false) && record["deal"].contains("deal")) {
      try {
        NodeSpec now = readNodeSpec(spec_path);
        putDealInForce(now.extra, record["deal"]["deal"]);
        writeJsonFile(spec_path, toJson(now));
        CAIRN_INFO("the deal taken is in force in ", spec_path);
      } catch (const std::exception& e) {
        CAIRN_WARN("could not write the deal taken into ", spec_path, ": ", e.what());
      }
    }
    if (options.on_record) options.on_record(record, line);
  };
}

void reportState(const ProviderRunOptions& options, const std::string& state,
                 const std::string& message) {
  if (options.on_event) options.on_event({{"state", state}, {"message", message}});
}

NodeRunnerConfig nodeRunnerConfig(const ProviderRunOptions& options,
                                  const StageTrainerConfig& config, const NodeSpec& node,
                                  const std::string& dir) {
  NodeRunnerConfig run_config;
  run_config.trainer = config;
  run_config.stage_path = dir + "/" + node.stage_file;
  run_config.node_data = options.node_data;
  run_config.resume = options.resume;
  run_config.max_wait = std::chrono::milliseconds(int64_t(config.options.timeouts.max_wait_s * 1000));
  run_config.observer.on_metrics_record = options.on_record;
  if (node.stage == 0)
    run_config.observer.on_batch = testHoldFromEnvironment(node.cluster, run_config.max_wait);
  if (node.stage == 0 && options.on_live_peers) {  // a volunteer's Root: growth updates reach it
    const std::string spec_path = nodeSpecPath(options.node_data, options.name);
    run_config.observer.on_metrics_record = recordTakingDeals(options, spec_path);
    run_config.deal_in_force = [spec_path] { return dealOf(readNodeSpec(spec_path)); };
  }
  if (options.on_event) {
    run_config.observer.on_plan = [&options, batch = config.options.batch_size](int64_t total,
                                                                                 int64_t per_epoch) {
      options.on_event({{"plan", {{"total_steps", total}, {"steps_per_epoch", per_epoch},
                                  {"batch_size", batch}}}});
    };
    run_config.on_state = [&options](const std::string& state, const std::string& message) {
      reportState(options, state, message);
    };
  }
  return run_config;
}

// Runs the node; on_event hears how the run ended.
NodeRunResult runReportingEnd(NodeRunner& runner, const ProviderRunOptions& options) {
  NodeRunResult run;
  try {
    run = runner.run();
  } catch (const PeerLost& e) {
    reportState(options, "lost-peer", e.what());
    throw;
  } catch (const std::exception& e) {
    reportState(options, "failed", e.what());
    throw;
  }
  reportState(options, !run.result.stopped ? "finished" : run.result.hand_over ? "handed-over" : "stopped",
              std::to_string(run.result.steps) + " steps");
  return run;
}

// The outcome and result.json's summary but "transport"; the trained stage saved to `dir` unless
// the run was stopped (a stopped run's state is in its checkpoint).
ProviderRunOutcome saveOutcome(const NodeRunResult& run, NodeRunner& runner, const std::string& dir) {
  const TrainerResult& result = run.result;
  ProviderRunOutcome outcome;
  outcome.stopped = result.stopped;
  outcome.handed_over = result.stopped && result.hand_over && result.stop_asked_here;
  outcome.result_path = dir + "/result.json";
  const std::string weights = dir + "/trained_stage.pt";
  nlohmann::json& summary = outcome.summary;
  summary = {{"steps", result.steps},
             {"last_loss", result.last_loss},
             {"seconds", result.seconds},
             {"train_samples_per_s", result.samples_per_second},
             {"stopped", result.stopped},
             {"pauses", run.pauses},
             {"resumed_from", run.resumed_from}};
  if (!result.stopped) {  // a stopped run's state is in its checkpoint
    // Device-free like the checkpoints: a stage trained on a GPU is saved from the host.
    torch::jit::Module& trained = runner.trainer().executor().module();
    trained.to(torch::kCPU);
    trained.save(weights + ".tmp");
    std::filesystem::rename(weights + ".tmp", weights);
    summary["weights"] = weights;
    outcome.weights_path = weights;
  }
  if (result.final_eval) {
    summary["eval"] = {{"samples", result.final_eval->samples},
                       {"loss", result.final_eval->loss},
                       {"accuracy", result.final_eval->accuracy},
                       {"perplexity", result.final_eval->perplexity}};
  }
  return outcome;
}

nlohmann::json transportSummary(const TransportStats& stats, bool insecure,
                                const ZapAuthenticator* authenticator, const LinkStats& link) {
  return {{"messages_received", stats.messages_received},
          {"messages_dropped", stats.messages_dropped},
          {"messages_forged", stats.messages_forged},
          {"messages_sent", stats.messages_sent},
          {"messages_sent_same_host", stats.messages_sent_same_host},
          {"messages_received_same_host", stats.messages_received_same_host},
          {"curve", !insecure},
          {"connections_refused", authenticator ? authenticator->rejected() : 0},
          {"pipeline_accepted", link.accepted},
          {"pipeline_dropped", link.dropped}};
}

void logEnd(const TrainerResult& result, const ProviderRunOptions& options,
            const std::string& weights) {
  if (result.stopped)
    CAIRN_INFO("stopped: ", result.steps, " steps; resume with `provider --name ", options.name,
               " --node-data ", options.node_data, " --resume`");
  else
    CAIRN_INFO("done: ", result.steps, " steps in ", result.seconds, " s; trained weights in ",
               weights);
}

void logTransportClosed(const TransportStats& stats, const ZapAuthenticator* authenticator) {
  CAIRN_INFO("transport: ", stats.messages_received, " messages received, ",
             stats.messages_dropped, " dropped (", stats.messages_forged, " forged)",
             authenticator ? ", " + std::to_string(authenticator->rejected()) +
                                 " connections refused"
                           : std::string());
}

}  // namespace

std::optional<nlohmann::json> startingOffer(const NodeSpec& node) {
  const nlohmann::json offer = offeredDealOf(node);
  if (offer.is_null()) return std::nullopt;
  return offer;
}

ProviderRunOutcome runProvider(const ProviderRunOptions& options) {
  const std::string& name = options.name;
  const std::string& node_data = options.node_data;
  setLogTag(name);
  const std::string job_path = jobSpecPath(node_data);
  const NodeSpec node = readNodeSpec(nodeSpecPath(node_data, name));
  const JobSpec job = readJobSpec(job_path);
  checkNodeOfJob(node, job, nodeSpecPath(node_data, name), name);
  const std::string dir = nodeDirectory(node_data, name);
  StageTrainerConfig config = trainerConfig(options, node, job, job_path, dir);
  int threads = config.options.threads;
  if (options.max_threads > 0 && threads > options.max_threads) {
    CAIRN_INFO("job.json asks for ", threads, " intra-op threads; this volunteer gives ",
               options.max_threads, " cores (--cores): ", options.max_threads, " threads");
    threads = options.max_threads;
  }
  setTorchThreads(threads);

  torch::jit::Module stage = loadStage(dir + "/" + node.stage_file);  // checked here; the
  // runner loads it afresh for every attempt
  const LinkChecks checks = linkChecks(config.options, job_path);
  zmq::context_t context;
  TransportOptions transport_options = transportOptions(options, node, checks, stage);
  const std::unique_ptr<ZapAuthenticator> authenticator =
      secureTransport(options, node, dir, context, &transport_options);
  const std::string bind = options.bind_address.empty() ? node.address : options.bind_address;
  ZmqTransport transport(context, name, node.dial_out_only ? "" : "tcp://" + bind, transport_options);
  Mailbox mailbox(transport);
  // A ring peer replaced mid-run is re-pointed live (provider --join); the hook is withdrawn
  // before the transport closes (explicitly below, or by `withdraw` on an exception).
  LivePeers live_peers(transport, authenticator.get(), node);
  logListening(job, node, config.num_clusters, bind);
  const LinkTimeouts timeouts = linkTimeouts(config.options.timeouts);
  // Ring members (other clusters) become transport peers before the pipeline handshake; the
  // first collective (the initial-weights check) waits for late members up to this timeout.
  const GradientSyncOptions gradient_sync = gradientSync(config.options.sync);
  RingClusterSync cluster_sync(mailbox, node, config.options.sync, config.options.local_steps,
                               std::max(timeouts.startup, timeouts.peer), gradient_sync,
                               RingStopHook{options.stop_requested, timeouts.lost});
  config.cluster_sync = &cluster_sync;
  // Registered after the ring sync it feeds (a ring member added by a new cluster: LivePeers adds
  // the peer, the ring sync the member), so it is withdrawn before either is gone.
  const WithdrawLivePeers withdraw{options};
  const std::shared_ptr<OfferedDeal> offered = pendingOffer(node);
  config.offered_deal = [offered]() -> std::optional<nlohmann::json> {
    std::lock_guard<std::mutex> lock(offered->mutex);
    return offered->deal;
  };
  if (options.on_live_peers)
    options.on_live_peers(livePeersHook(live_peers, cluster_sync, offered, node));
  MailboxStageLink link(mailbox, node, timeouts, checks);
  link.setReplaced(options.neighbour_replaced);
  link.decodeOn(config.placement);
  const NodeRunnerConfig run_config = nodeRunnerConfig(options, config, node, dir);
  stage = torch::jit::Module();
  NodeRunner runner(run_config, mailbox, link, &cluster_sync);
  const NodeRunResult run = runReportingEnd(runner, options);
  ProviderRunOutcome outcome = saveOutcome(run, runner, dir);
  const TransportStats stats = transport.stats();
  outcome.summary["transport"] =
      transportSummary(stats, options.insecure, authenticator.get(), link.stats());
  writeJsonFile(outcome.result_path, outcome.summary);
  logEnd(run.result, options, outcome.weights_path);
  if (options.on_live_peers) options.on_live_peers({});
  // Left already when the run ended (finish, a stop); this also stops the rings' welcome desk
  // (node/ring/RingWelcomeDesk.h) in any case, so no thread uses the transport while it closes.
  cluster_sync.leave();
  transport.flushAndClose(std::chrono::milliseconds(5000));
  logTransportClosed(stats, authenticator.get());
  return outcome;
}

}  // namespace cairn
