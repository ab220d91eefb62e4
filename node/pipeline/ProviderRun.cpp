#include "node/pipeline/ProviderRun.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>

#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/NodeData.h"
#include "node/transport/LivePeers.h"
#include "node/pipeline/MailboxStageLink.h"
#include "node/pipeline/NodeRunner.h"
#include "node/transport/NodeSecurity.h"
#include "node/ring/RingClusterSync.h"
#include "node/transport/ZmqTransport.h"
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

torch::jit::Module loadStage(const std::string& path) {
  try {
    return torch::jit::load(path);
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, path, ": cannot load the TorchScript stage: ",
                std::string(e.what_without_backtrace()).substr(0, 300));
  }
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

}  // namespace

ProviderRunOutcome runProvider(const ProviderRunOptions& options) {
  const std::string& name = options.name;
  const std::string& node_data = options.node_data;
  setLogTag(name);
  const std::string job_path = jobSpecPath(node_data);
  const NodeSpec node = readNodeSpec(nodeSpecPath(node_data, name));
  const JobSpec job = readJobSpec(job_path);
  if (node.name != name)
    CAIRN_THROW(BadInput, nodeSpecPath(node_data, name), ": name is \"", node.name, "\", not \"",
                name, "\"");
  if (node.job_id != job.job_id)
    CAIRN_THROW(BadInput, nodeSpecPath(node_data, name), ": job_id \"", node.job_id,
                "\" differs from job.json's \"", job.job_id, "\"");
  StageTrainerConfig config;
  config.node = node;
  config.options = parseTrainOptions(job.training, job_path);
  config.data = parseDataOptions(job.data, job_path);
  config.num_clusters = countClusters(node_data, node);
  const std::string dir = nodeDirectory(node_data, name);
  config.metrics_path = dir + "/metrics.jsonl";
  config.sample_ids_path = dir + "/sample_ids.jsonl";
  // Always set: a stop (signal) checkpoints even when checkpoint_every is 0; periodic
  // checkpoints (and so pausing on a lost neighbour) need checkpoint_every > 0.
  config.checkpoint_dir = dir + "/checkpoints";
  config.keep_checkpoints_from = options.keep_checkpoints_from;
  config.stop_requested = options.stop_requested;
  config.chunk_source = options.chunk_source;  // data.source "coordinator" (provider --join)
  at::set_num_threads(config.options.threads);
  // Once per process: libtorch refuses it after parallel work started (provider --join runs its
  // stage again in-process after a peer was replaced, node/volunteer/VolunteerPeers.h).
  static std::once_flag interop_threads_set;
  std::call_once(interop_threads_set, [] { at::set_num_interop_threads(1); });

  torch::jit::Module stage = loadStage(dir + "/" + node.stage_file);  // checked here; the
  // runner loads it afresh for every attempt
  // What pipeline messages may look like (MailboxStageLink checks every one).
  LinkChecks checks;
  checks.max_microbatch_rows = (config.options.batch_size + config.options.microbatches - 1) /
                               config.options.microbatches;
  checks.max_eval_rows = config.options.eval_batch_size;
  checks.step_window = uint64_t(config.options.step_window);
  checks.stop_on_nonfinite = config.options.nonfinite == NonFiniteAction::kStop;
  checks.wire_float = stageWireDtype(toString(config.options.wire.activations), job_path);
  checks.max_extra_tensors = 5;  // __targets, __ids, __denominator, __stop_at, __epoch_steps
  // ZMQ_MAXMSGSIZE: the largest planned message, pipeline or ring (parameters of this stage).
  uint64_t parameter_bytes = 0;
  for (const auto& p : stage.named_parameters()) parameter_bytes += p.value.nbytes();
  for (const auto& b : stage.named_buffers()) parameter_bytes += b.value.nbytes();
  zmq::context_t context;
  TransportOptions transport_options;
  transport_options.codec.max_message_bytes =
      std::max(plannedMessageBytes(node, checks), parameter_bytes + (1u << 20));
  // Neighbours and ring peers on this host (loopback addresses) over a Unix-domain socket in this
  // user's 0700 directory instead of CURVE over TCP (docs/PROTOCOL.md "Same-host links").
  if (options.same_host_links) transport_options.same_host_dir = sameHostDir();
  transport_options.advertised_endpoint = "tcp://" + node.address;
  std::unique_ptr<ZapAuthenticator> authenticator;  // before the transport, outlives it
  if (options.insecure) {
    CAIRN_WARN("--insecure: CurveZMQ is off; messages are neither encrypted nor authenticated "
               "and anyone who can reach ", node.address, " can talk to this node");
  } else {
    transport_options.curve =
        curveOptionsForNode(node, nodeSpecPath(node_data, name), dir + "/" + kSecretKeyFile);
    authenticator =
        std::make_unique<ZapAuthenticator>(context, admittedKeys(*transport_options.curve));
    CAIRN_INFO("CurveZMQ on: admitting ", transport_options.curve->peer_public_keys.size(),
               " peer keys");
  }
  const std::string bind = options.bind_address.empty() ? node.address : options.bind_address;
  ZmqTransport transport(context, name, "tcp://" + bind, transport_options);
  Mailbox mailbox(transport);
  // A ring peer replaced mid-run is re-pointed live (provider --join); the hook is withdrawn
  // before the transport closes (explicitly below, or by `withdraw` on an exception).
  LivePeers live_peers(transport, authenticator.get(), node);
  CAIRN_INFO("job ", job.job_id, ": cluster ", node.cluster, " of ", config.num_clusters,
             ", stage ", node.stage + 1, "/", node.num_stages, " (", toString(node.role),
             "), listening on ", bind,
             bind == node.address ? std::string() : " (peers dial " + node.address + ")");
  LinkTimeouts timeouts;
  timeouts.startup = std::chrono::milliseconds(int64_t(config.options.timeouts.startup_s * 1000));
  timeouts.peer = std::chrono::milliseconds(int64_t(config.options.timeouts.peer_s * 1000));
  timeouts.lost = std::chrono::milliseconds(int64_t(config.options.timeouts.peer_timeout_s * 1000));
  // Ring members (other clusters) become transport peers before the pipeline handshake; the
  // first collective (the initial-weights check) waits for late members up to this timeout.
  // "gradients": job.json sync.bucket_bytes and sync.overlap (RingClusterSync.h
  // GradientSyncOptions; the same job.json on every member, so every ring cuts the same buckets).
  GradientSyncOptions gradient_sync;
  gradient_sync.bucket_bytes = config.options.sync.bucket_bytes;
  gradient_sync.overlap = config.options.sync.overlap;
  if (config.options.sync.mode == SyncMode::kGradients)
    CAIRN_INFO("gradients: buckets of at most ", gradient_sync.bucket_bytes, " bytes, all-reduce ",
               gradient_sync.overlap ? "overlapped with the last backward" : "after backward");
  RingClusterSync cluster_sync(mailbox, node, config.options.sync, config.options.local_steps,
                               std::max(timeouts.startup, timeouts.peer), gradient_sync);
  config.cluster_sync = &cluster_sync;
  // Registered after the ring sync it feeds (a ring member added by a new cluster: LivePeers adds
  // the peer, the ring sync the member), so it is withdrawn before either is gone.
  struct Withdraw {
    const ProviderRunOptions& o;
    ~Withdraw() {
      if (o.on_live_peers) o.on_live_peers({});
    }
  } withdraw{options};
  // A growth update (docs/OPERATIONS.md "Growing") also brings a new extra.deal: the Root takes it
  // between steps (trainer/DealChange.h) and the rings take the new members in at the new
  // cluster's first step, not before.
  struct OfferedDeal {
    std::mutex mutex;
    std::optional<nlohmann::json> deal;  // under mutex
  };
  auto offered = std::make_shared<OfferedDeal>();
  // Restarted (a pause, --resume) while an offer was undecided: it is offered again; the plan
  // follows the deal in force (extra.deal).
  if (const nlohmann::json pending = offeredDealOf(node); !pending.is_null() && pending != dealOf(node))
    offered->deal = pending;
  config.offered_deal = [offered]() -> std::optional<nlohmann::json> {
    std::lock_guard<std::mutex> lock(offered->mutex);
    return offered->deal;
  };
  if (options.on_live_peers)
    options.on_live_peers([&live_peers, &cluster_sync, offered,
                           started_with = dealOf(node)](const NodeSpec& updated) {
      const nlohmann::json deal = offeredDealOf(updated);
      const bool grows = !deal.is_null() && deal != started_with;
      std::vector<std::string> changed = live_peers.apply(updated);
      for (const std::string& added : cluster_sync.addMembers(updated, grows))
        changed.push_back(added + (grows ? " joins the rings at the new cluster's first step"
                                         : " joins the rings"));
      if (grows) {
        std::lock_guard<std::mutex> lock(offered->mutex);
        offered->deal = deal;
      }
      return changed;
    });
  MailboxStageLink link(mailbox, node, timeouts, checks);
  NodeRunnerConfig run_config;
  run_config.trainer = config;
  run_config.stage_path = dir + "/" + node.stage_file;
  run_config.node_data = node_data;
  run_config.resume = options.resume;
  run_config.max_wait = std::chrono::milliseconds(int64_t(config.options.timeouts.max_wait_s * 1000));
  auto event = [&options](const std::string& state, const std::string& message) {
    if (options.on_event) options.on_event({{"state", state}, {"message", message}});
  };
  // The Root that takes an offered deal writes it into its own node.json as the deal in force
  // (a restart before the coordinator's next update then plans with it, not with the old one).
  // The coordinator's update after every Root took it says the same (VolunteerPeers writes it).
  const std::string spec_path = nodeSpecPath(node_data, name);
  run_config.observer.on_metrics_record = options.on_record;
  if (node.stage == 0 && options.on_live_peers)  // a volunteer's Root: growth updates reach it
    run_config.observer.on_metrics_record = [&options, spec_path](const nlohmann::json& record,
                                                                  const std::string& line) {
      if (record.is_object() && record.contains("deal") && record["deal"].is_object() &&
          record["deal"].value("accepted", false) && record["deal"].contains("deal")) {
        try {
          NodeSpec now = readNodeSpec(spec_path);
          now.extra["deal"] = record["deal"]["deal"];
          now.extra.erase("offered_deal");
          writeJsonFile(spec_path, toJson(now));
          CAIRN_INFO("the deal taken is in force in ", spec_path);
        } catch (const std::exception& e) {
          CAIRN_WARN("could not write the deal taken into ", spec_path, ": ", e.what());
        }
      }
      if (options.on_record) options.on_record(record, line);
    };
  if (options.on_event) {
    run_config.observer.on_plan = [&options, batch = config.options.batch_size](int64_t total,
                                                                                 int64_t per_epoch) {
      options.on_event({{"plan", {{"total_steps", total}, {"steps_per_epoch", per_epoch},
                                  {"batch_size", batch}}}});
    };
    run_config.on_state = event;
  }
  stage = torch::jit::Module();
  NodeRunner runner(run_config, mailbox, link, &cluster_sync);
  NodeRunResult run;
  try {
    run = runner.run();
  } catch (const PeerLost& e) {
    event("lost-peer", e.what());
    throw;
  } catch (const std::exception& e) {
    event("failed", e.what());
    throw;
  }
  event(run.result.stopped ? "stopped" : "finished",
        std::to_string(run.result.steps) + " steps");
  const TrainerResult& result = run.result;
  ProviderRunOutcome outcome;
  outcome.stopped = result.stopped;
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
    runner.trainer().executor().module().save(weights + ".tmp");
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
  const TransportStats stats = transport.stats();
  summary["transport"] = {{"messages_received", stats.messages_received},
                          {"messages_dropped", stats.messages_dropped},
                          {"messages_forged", stats.messages_forged},
                          {"messages_sent", stats.messages_sent},
                          {"messages_sent_same_host", stats.messages_sent_same_host},
                          {"messages_received_same_host", stats.messages_received_same_host},
                          {"curve", !options.insecure},
                          {"connections_refused", authenticator ? authenticator->rejected() : 0},
                          {"pipeline_accepted", link.stats().accepted},
                          {"pipeline_dropped", link.stats().dropped}};
  writeJsonFile(outcome.result_path, summary);
  if (result.stopped)
    CAIRN_INFO("stopped: ", result.steps, " steps; resume with `provider --name ", name,
               " --node-data ", node_data, " --resume`");
  else
    CAIRN_INFO("done: ", result.steps, " steps in ", result.seconds, " s; trained weights in ",
               weights);
  if (options.on_live_peers) options.on_live_peers({});
  transport.flushAndClose(std::chrono::milliseconds(5000));
  CAIRN_INFO("transport: ", stats.messages_received, " messages received, ",
             stats.messages_dropped, " dropped (", stats.messages_forged, " forged)",
             authenticator ? ", " + std::to_string(authenticator->rejected()) +
                                 " connections refused"
                           : std::string());
  return outcome;
}

}  // namespace cairn
