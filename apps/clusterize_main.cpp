// clusterize: plan a cairn job — profile a TorchScript model, cut it into stages, place them on the
// nodes of node_configs.json, write node_data/ — and, after training, merge the trained stages
// back into the original model (--merge). See `clusterize --help` and docs/CLUSTERIZE.md.
#include <CLI/CLI.hpp>
#include <iostream>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include <unistd.h>

#include "clusterize/Clusterize.h"
#include "clusterize/ModelMerge.h"
#include "clusterize/NodeDataWriter.h"
#include "clusterize/Rebalance.h"
#include "core/JsonReader.h"
#include "coordinator/Coordinator.h"
#include "coordinator/RunView.h"
#include "coordinator/WebServer.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/MainGuard.h"
#include "trainer/CheckpointCarry.h"

namespace {

// --serve: SIGINT/SIGTERM stop the coordinator at its next loop turn; its state stays in
// coordinator.db. Training on the volunteers goes on without it.
std::atomic<bool> g_serve_stop{false};
extern "C" void onServeSignal(int) { g_serve_stop = true; }
void installServeStop() {
  struct sigaction action {};
  action.sa_handler = onServeSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

std::set<std::string> readAllowedKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot read the --allow-keys file");
  std::set<std::string> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const std::string key = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    if (!cairn::isZ85Key(key))
      CAIRN_THROW(BadInput, path, ":", number, ": \"", key.substr(0, 60),
                  "\" is not a CURVE public key (40 Z85 characters)");
    keys.insert(key);
  }
  if (keys.empty()) CAIRN_THROW(BadInput, path, ": lists no keys");
  return keys;
}

// --web: a bare port means 127.0.0.1:PORT (this machine only); other hosts must be named.
std::string webAddress(const std::string& value) {
  const bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
  if (digits && value.size() <= 5) return "127.0.0.1:" + value;
  if (digits || value.find(':') == std::string::npos)
    CAIRN_THROW(BadInput, "--web must be PORT (127.0.0.1 only) or HOST:PORT, e.g. 8080 or "
                "0.0.0.0:8080; got \"", value, "\"");
  return value;
}

// The web view starts before the model is profiled (a bad --web fails at once); until the
// coordinator exists its state is this.
nlohmann::json startingSnapshot() {
  const double now = cairn::coordinator::unixNow();
  return {{"run", {{"phase", "starting"}, {"now", now}, {"started_at", now}, {"num_clusters", 0},
                   {"members", 0}, {"records", 0}, {"dropped", 0}}},
          {"clusters", nlohmann::json::array()}, {"nodes", nlohmann::json::array()},
          {"events", nlohmann::json::array()}};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace cairn::clusterize;
  CLI::App app{
      "clusterize: profile a TorchScript model, cut its forward graph into stages, form clusters "
      "of nodes and write node_data/ (plan.json, job.json, nodes/node_<id>/{stage.pt,node.json}).\n"
      "Example: clusterize --model cnn.pt --nodes node_data/node_configs.json --input-shape "
      "64,1,28,28\n"
      "After training: clusterize --merge node_data --out trained.pt [--format safetensors] "
      "[--cluster N]"};
  ClusterizeOptions o;
  o.nodes_path = "node_data/node_configs.json";
  std::string out_dir = "node_data";
  std::string granularity = "top";
  int microbatches = 4;
  std::string optimizer = "adam";
  auto* model = app.add_option("--model", o.model_path,
                               "TorchScript model file (torch.jit.save / Module::save); "
                               "required for planning; with --merge: default plan.json's");
  app.add_option("--weights", o.weights_path,
                 "safetensors file of initial weights loaded into the model "
                 "before cutting (names, shapes and dtypes must match the "
                 "model's parameters and buffers); default: the model's own");
  app.add_option("--nodes", o.nodes_path,
                 "node_configs.json (Ravnest format: IP, benchmarks.ram GB, "
                 "benchmarks.bandwidth Mbps, optional benchmarks.compute)")
      ->capture_default_str();
  auto* out = app.add_option("--out", out_dir,
                             "output folder; only files clusterize wrote are replaced. "
                             "With --merge: the model file to write (default "
                             "NODE_DATA/trained.pt, or trained.safetensors)")
                  ->capture_default_str();
  app.add_option("--job", o.job_path,
                 "job.json to use (validated; its training_definition.optimizer "
                 "and .microbatches apply unless the flags are given; .wire.activations sets the "
                 "bytes the time estimate counts per transfer); default: built from the flags below");
  app.add_option("--job-id", o.job_id, "job id when job.json is built from flags")
      ->capture_default_str();
  app.add_option("--data", o.data_location, "data location when job.json is built from flags")
      ->capture_default_str();
  app.add_option("--data-format", o.data_format,
                 "data format: idx, images, safetensors, npy or tokens")
      ->capture_default_str();
  app.add_option("--loss", o.loss, "loss_fn written to job.json")->capture_default_str();
  app.add_option("--lr", o.learning_rate, "learning rate written to job.json")
      ->capture_default_str();
  app.add_option("--local-steps", o.local_steps, "local_steps written to job.json")
      ->capture_default_str();
  app.add_option("--clusters", o.clusters,
                 "number of clusters; 0 = as many as the nodes' memory allows")
      ->capture_default_str();
  app.add_option("--plan-tolerance", o.plan_tolerance,
                 "splits whose slowest stage is within this fraction of the optimum count as equal "
                 "and the canonical one is taken (each node in order the longest range), so timing "
                 "noise below it does not move the cuts; 0 = the exact optimum")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed for tie-breaking among equal nodes and for example inputs")
      ->capture_default_str();
  app.add_option("--granularity", granularity,
                 "units to cut between: top (top-level forward nodes) or "
                 "expand-containers (also the elements of child nn.Sequential)")
      ->capture_default_str();
  app.add_option("--input-shape", o.input_shapes,
                 "example input shape, e.g. 64,1,28,28 (first dim = "
                 "micro-batch size); repeat once per model input");
  app.add_option("--input-dtype", o.input_dtypes,
                 "example input dtype (float32, float64, float16, "
                 "bfloat16, int64, int32, uint8, bool); once for all "
                 "inputs or once per input; integer inputs are zeros")
      ->capture_default_str();
  app.add_option("--example", o.example_path,
                 "torch.save'd example input (a tensor, or a tuple/list "
                 "of inputs) instead of --input-shape");
  auto* mb = app.add_option("--microbatches", microbatches,
                            "micro-batches in flight per step (memory "
                            "estimate); default: job.json's, else")
                 ->capture_default_str();
  auto* opt = app.add_option("--optimizer", optimizer,
                             "sgd, momentum, adam or adamw (optimizer state "
                             "in the memory estimate); default: job.json's, else")
                  ->capture_default_str();
  app.add_option("--cuts", o.cuts,
                 "fix the stage boundaries instead of letting the planner choose: unit "
                 "indices where stages 1, 2, ... begin, e.g. --cuts 4,9 (3 stages); each "
                 "cluster gets exactly these stages, the planner still places them on nodes. "
                 "plan.json's \"units\" lists the units and which are valid cuts")
      ->delimiter(',');
  app.add_option("--profile-runs", o.profile.timed_runs,
                 "timed forward+backward runs per unit (the fastest is kept)")
      ->capture_default_str();
  // Serve mode: volunteers join by invite instead of --nodes (coordinator/, docs/OPERATIONS.md).
  cairn::coordinator::CoordinatorOptions serve;
  double gather_s = 30, reach_timeout_s = 5, lost_after_s = 15;
  std::string allow_keys_path;
  auto* serve_option = app.add_option(
      "--serve", serve.listen,
      "coordinator mode: listen on HOST:PORT for volunteers (`provider --join INVITE`) instead "
      "of reading --nodes; print the invite, plan once enough have joined, send each its stage, "
      "keep the rest as spares, collect the trained stages and merge them into "
      "OUT/trained.pt and OUT/trained.safetensors. State in OUT/coordinator.db: run the same "
      "command again to pick the run up");
  app.add_option("--advertise", serve.advertise,
                 "with --serve: the HOST:PORT volunteers dial (default: the --serve address; "
                 "required when it is 0.0.0.0)")
      ->needs(serve_option);
  app.add_option("--min-volunteers", serve.min_volunteers,
                 "with --serve: plan once this many volunteers have joined")
      ->check(CLI::Range(1, 100000))->capture_default_str()->needs(serve_option);
  app.add_option("--max-volunteers", serve.max_volunteers,
                 "with --serve: plan at once when this many have joined (default: "
                 "--min-volunteers); between the two, wait up to --gather-s for more")
      ->check(CLI::Range(0, 100000))->needs(serve_option);
  app.add_option("--gather-s", gather_s,
                 "with --serve: seconds to wait for more volunteers once --min-volunteers joined")
      ->check(CLI::Range(0.0, 86400.0))->capture_default_str()->needs(serve_option);
  app.add_option("--reach-timeout-s", reach_timeout_s,
                 "with --serve: seconds a joining volunteer's advertised address has to answer "
                 "the coordinator's dial-back")
      ->check(CLI::Range(0.1, 600.0))->capture_default_str()->needs(serve_option);
  app.add_option("--lost-after-s", lost_after_s,
                 "with --serve: a placed volunteer whose heartbeats stop this long is lost; a "
                 "waiting spare takes its node over from the newest checkpoint the coordinator "
                 "holds, and its neighbours and ring peers are sent its new address and key")
      ->check(CLI::Range(1.0, 86400.0))->capture_default_str()->needs(serve_option);
  app.add_flag("--grow", serve.grow,
               "with --serve: while the run trains, spares that can hold one more whole pipeline "
               "of the planned cut form a new cluster: the data is dealt over one more cluster "
               "from the epoch after the newest a Root reported, the new cluster starts at that "
               "epoch's first step with its ring peers' weights (docs/OPERATIONS.md \"Growing\"); "
               "needs data.chunks >= the number of clusters and the sync schedule (an async job "
               "is refused, exit 2); off by default")
      ->needs(serve_option);
  app.add_option("--max-clusters", serve.max_clusters,
                 "with --grow: grow to at most this many clusters (0: no limit)")
      ->check(CLI::Range(0, 100000))->capture_default_str()->needs(serve_option);
  app.add_option("--keep-spares", serve.keep_spares,
                 "with --grow: spares that growth leaves waiting to replace lost volunteers")
      ->check(CLI::Range(0, 100000))->capture_default_str()->needs(serve_option);
  app.add_option("--token", serve.token,
                 "with --serve: the invite token (32-128 lowercase hex digits); default: the "
                 "stored one, else a fresh random one")
      ->needs(serve_option);
  app.add_option("--allow-keys", allow_keys_path,
                 "with --serve: a file of volunteer public keys (Z85, one per line; # comments): "
                 "only these may join, token or not")
      ->needs(serve_option);
  app.add_option("--invite-file", serve.invite_file,
                 "with --serve: also write the invite to this file")
      ->needs(serve_option);
  double view_every_s = -1;
  app.add_option("--view-every-s", view_every_s,
                 "with --serve: the live view of the run on stdout (per cluster step, loss, "
                 "samples/s, ETA; per node role, state, heartbeat age, time split; events) every "
                 "this many seconds: redrawn in place on a terminal, plain lines otherwise; "
                 "0: off (default: 1 on a terminal, 10 otherwise)")
      ->check(CLI::Range(0.0, 86400.0))->needs(serve_option);
  std::string web_listen;
  app.add_option("--web", web_listen,
                 "with --serve: serve the run's read-only live view on PORT or HOST:PORT: the "
                 "page (charts of loss, evaluation, throughput and each node's time split; the "
                 "clusters as chains of nodes; events), /api/state (JSON) and /metrics "
                 "(Prometheus). A bare PORT binds 127.0.0.1 only; name a host (e.g. "
                 "0.0.0.0:8080) to let other machines see it: the page has no login. Port 0: any "
                 "free port. The URL is printed. Default: off")
      ->needs(serve_option);
  std::string merge_from;
  std::string format = "torchscript";
  int cluster = 0;
  auto* merge = app.add_option("--merge", merge_from,
                               "merge mode: read NODE_DATA/plan.json and every "
                               "node's trained_stage.pt and write the trained "
                               "original model to --out; no planning");
  auto* format_option = app.add_option("--format", format,
                                       "with --merge: torchscript (loads with "
                                       "torch.jit.load) or safetensors (original "
                                       "parameter and buffer names)")
                            ->capture_default_str()
                            ->needs(merge);
  auto* cluster_option = app.add_option("--cluster", cluster,
                                        "with --merge: take cluster N's weights; "
                                        "default: average floating-point tensors "
                                        "over all clusters, maximum of integer ones; "
                                        "with --rebalance: the cluster to re-cut (default 0)");
  std::string rebalance_from;
  auto* rebalance = app.add_option(
      "--rebalance", rebalance_from,
      "rebalance mode: read NODE_DATA/plan.json and each stage's NODE_DATA/nodes/<node>/"
      "metrics.jsonl, spread every stage's median compute_s over its units in proportion to the "
      "profiled unit times, cut again with the planner (--plan-tolerance applies), print the "
      "measured and predicted stage times and the new --cuts, and write NODE_DATA/"
      "rebalance.json; no stage files are changed: re-plan with --cuts and --resume-from "
      "NODE_DATA to continue the run at the new cut (docs/CLUSTERIZE.md \"Rebalancing from "
      "measurement\")");
  std::string resume_from;
  int64_t resume_step = -1;
  auto* resume_from_option = app.add_option(
      "--resume-from", resume_from,
      "planning: carry the run of OLD_NODE_DATA (a plan of the same model and job, e.g. before a "
      "--rebalance re-cut) into this plan: from the newest step every old node has a checkpoint "
      "of, its weights, buffers, optimizer state (by parameter name), step, data cursor and lr "
      "schedule position become a checkpoint per new node in OUT/nodes/<node>/checkpoints; start "
      "the new providers with --resume. Same number of clusters; --out must be another folder "
      "(docs/CLUSTERIZE.md \"Carrying the run over\")");
  app.add_option("--resume-step", resume_step,
                 "with --resume-from: carry this step instead of the newest common one")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 60))
      ->needs(resume_from_option);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (rebalance->count() > 0) {
    return cairn::runGuarded("clusterize", [&] {
      for (const CLI::Option* given : app.get_options())
        if (given->count() > 0 && given != rebalance && given != cluster_option &&
            given->get_name() != "--plan-tolerance")
          CAIRN_THROW(BadInput, "--rebalance takes only --cluster and --plan-tolerance (got ",
                      given->get_name(), ")");
      const RebalanceResult r = rebalanceFromNodeData(rebalance_from, cluster, o.plan_tolerance);
      const nlohmann::json j = r.toJson();
      cairn::writeJsonFile(rebalance_from + "/rebalance.json", j);
      auto cuts = [](const std::vector<int>& v) {
        std::string s;
        for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
        return s.empty() ? std::string("(one stage)") : s;
      };
      std::cout << "cluster " << r.cluster << " measured ms per micro-batch (median compute_s / "
                << r.microbatches << "):";
      for (double x : r.measured_stage_seconds) std::cout << " " << x * 1e3;
      std::cout << "  max/mean " << j["measured_max_over_mean"].get<double>() << "\n"
                << "predicted after re-cut:";
      for (double x : r.predicted_stage_seconds) std::cout << " " << x * 1e3;
      std::cout << "  max/mean " << j["predicted_max_over_mean"].get<double>() << "\n"
                << "cuts: " << cuts(r.old_cuts) << " -> " << cuts(r.new_cuts) << "\n"
                << "wrote " << rebalance_from << "/rebalance.json\n"
                << "next: clusterize <the same planning flags> --cuts " << cuts(r.new_cuts)
                << " --out NEW_NODE_DATA --resume-from " << rebalance_from
                << "  (carries the checkpointed run over; provider --resume continues it)\n";
      return 0;
    });
  }
  if (cluster_option->count() > 0 && merge->count() == 0)
    return cairn::runGuarded("clusterize", [&]() -> int {
      CAIRN_THROW(BadInput, "--cluster needs --merge or --rebalance");
    });
  if (merge->count() > 0) {
    return cairn::runGuarded("clusterize", [&] {
      for (const CLI::Option* given : app.get_options())
        if (given->count() > 0 && given != merge && given != out && given != format_option &&
            given != cluster_option && given != model)
          CAIRN_THROW(BadInput,
                      "--merge takes only --out, --format, --cluster and --model (got ",
                      given->get_name(), ")");
      MergeOptions m;
      m.node_data = merge_from;
      m.model_path = o.model_path;
      if (cluster_option->count() > 0) m.cluster = cluster;
      const MergeFormat merge_format = parseMergeFormat(format);
      const std::string target =
          out->count() > 0
              ? out_dir
              : merge_from + (merge_format == MergeFormat::kSafetensors ? "/trained.safetensors"
                                                                        : "/trained.pt");
      const MergedModel merged = mergeTrainedStages(m);
      saveMergedModel(merged, target, merge_format);
      std::cout << "merged " << merged.state.size() << " parameters and buffers from "
                << (m.cluster ? "cluster " + std::to_string(*m.cluster)
                              : std::to_string(merged.clusters.size()) +
                                    " cluster(s) (floating point "
                                    "averaged, integers maximum)")
                << " into " << target << " (" << format << ")\n";
      if (!merged.untouched.empty()) {
        std::cout << "kept from the model file (no stage uses them):";
        for (const auto& name : merged.untouched) std::cout << " " << name;
        std::cout << "\n";
      }
      return 0;
    });
  }
  if (serve_option->count() > 0 && resume_from_option->count() > 0)
    return cairn::runGuarded("clusterize", [&]() -> int {
      CAIRN_THROW(BadInput, "--resume-from is for planning with --nodes, not --serve");
    });
  if (serve_option->count() > 0) {
    installServeStop();
    return cairn::runGuarded("clusterize", [&] {
      o.granularity = parseGranularity(granularity);
      if (mb->count() > 0) o.microbatches = microbatches;
      if (opt->count() > 0) o.optimizer = optimizer;
      serve.out = out_dir;
      serve.gather = std::chrono::milliseconds(int64_t(gather_s * 1000));
      serve.reach_timeout = std::chrono::milliseconds(int64_t(reach_timeout_s * 1000));
      serve.lost_after = std::chrono::milliseconds(int64_t(lost_after_s * 1000));
      if (!allow_keys_path.empty()) serve.allowed_keys = readAllowedKeys(allow_keys_path);
      serve.stop_requested = [] { return g_serve_stop.load(); };
      if (view_every_s < 0) view_every_s = ::isatty(STDOUT_FILENO) == 1 ? 1 : 10;
      serve.view_every = std::chrono::milliseconds(int64_t(view_every_s * 1000));
      std::atomic<const cairn::coordinator::RunView*> view{nullptr};
      std::unique_ptr<cairn::coordinator::WebServer> web;
      if (!web_listen.empty()) {
        web = std::make_unique<cairn::coordinator::WebServer>(
            webAddress(web_listen),
            [&view] { return view ? view.load()->snapshot() : startingSnapshot(); },
            [&view] { return view ? view.load()->prometheus() : std::string(); }, "--web");
        std::cout << "web view: " << web->url() << std::endl;
      }
      cairn::clusterize::PreparedModel prepared = prepareModel(o);
      // Only the sync schedule takes a grown deal (trainer/DealChange.h): refuse the combination
      // before anyone joins instead of leaving spares assigned to a deal nobody answers.
      if (serve.grow && prepared.job.training.is_object() &&
          prepared.job.training.value("schedule", std::string("sync")) == "async")
        CAIRN_THROW(BadInput, o.job_path.empty() ? std::string("the job") : o.job_path,
                    ": training_definition.schedule is \"async\", but --grow needs \"sync\" (an "
                    "async run cannot take a new deal mid-run); drop --grow or use the sync schedule");
      cairn::coordinator::Coordinator coordinator(serve, std::move(prepared));
      // Declared after the coordinator, so destroyed before it: no request reads a view that is
      // gone.
      struct StopWeb {
        cairn::coordinator::WebServer* web;
        ~StopWeb() { if (web) web->stop(); }
      } stop_web{web.get()};
      view = &coordinator.view();
      return coordinator.run();
    });
  }
  return cairn::runGuarded("clusterize", [&] {
    o.granularity = parseGranularity(granularity);
    if (mb->count() > 0) o.microbatches = microbatches;
    if (opt->count() > 0) o.optimizer = optimizer;
    if (!resume_from.empty()) {
      namespace fs = std::filesystem;
      std::error_code ec;
      if (fs::weakly_canonical(resume_from, ec) == fs::weakly_canonical(out_dir, ec))
        CAIRN_THROW(BadInput, "--out ", out_dir, " is the --resume-from folder: write the new "
                    "plan to another folder (its stage files and checkpoints would be replaced)");
      if (!fs::is_regular_file(cairn::jobSpecPath(resume_from), ec))
        CAIRN_THROW(BadInput, cairn::jobSpecPath(resume_from),
                    ": no such file: --resume-from needs a node_data folder written by clusterize");
    }
    const ClusterizeResult result = clusterize(o);
    // Everything about the carry is checked before anything is written.
    std::optional<cairn::CarryResult> carry;
    if (!resume_from.empty()) {
      std::vector<cairn::CarryStage> stages;
      for (const auto& node : result.nodes)
        stages.push_back(cairn::carryStageOf(node, result.stages.at(node.name)));
      carry = cairn::planCarry(resume_from, result.job,
                               o.job_path.empty() ? std::string("the job built from the flags")
                                                  : o.job_path,
                               stages, resume_step);
    }
    NodeDataWriter(out_dir).write(result.plan, result.job, result.nodes, result.stages);
    printReport(result.plan, std::cout);
    std::cout << "wrote " << out_dir << "/plan.json, job.json and " << result.nodes.size()
              << " node folder(s) under " << out_dir << "/nodes\n";
    if (carry) {
      const auto paths = cairn::writeCarry(out_dir, *carry);
      std::cout << "carried step " << carry->step << " of " << resume_from << " (weights, "
                << "optimizer state, data cursor) into " << paths.size()
                << " checkpoint(s), e.g. " << paths.front() << "\n"
                << "continue with: provider --name <node> --node-data " << out_dir
                << " --resume (every node)\n";
    }
    return 0;
  });
}
