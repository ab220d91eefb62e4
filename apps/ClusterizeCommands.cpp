#include "apps/ClusterizeCommands.h"

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include <unistd.h>

#include "clusterize/ModelMerge.h"
#include "clusterize/NodeDataWriter.h"
#include "clusterize/Rebalance.h"
#include "coordinator/RunView.h"
#include "coordinator/WebServer.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "trainer/CheckpointCarry.h"

namespace cairn::apps {
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

// A mode that takes only some flags: BadInput naming the first other one given.
void refuseOtherOptions(const CLI::App& app, const std::set<const CLI::Option*>& allowed,
                        const char* message_start) {
  for (const CLI::Option* given : app.get_options())
    if (given->count() > 0 && allowed.count(given) == 0)
      CAIRN_THROW(BadInput, message_start, given->get_name(), ")");
}

// "4,9", or "(one stage)" for none.
std::string cutsText(const std::vector<int>& cuts) {
  std::string s;
  for (size_t i = 0; i < cuts.size(); ++i) s += (i ? "," : "") + std::to_string(cuts[i]);
  return s.empty() ? std::string("(one stage)") : s;
}

void printRebalance(const clusterize::RebalanceResult& r, const nlohmann::json& j,
                    const std::string& from) {
  std::cout << "cluster " << r.cluster << " measured ms per micro-batch (median compute_s / "
            << r.microbatches << "):";
  for (double x : r.measured_stage_seconds) std::cout << " " << x * 1e3;
  std::cout << "  max/mean " << j["measured_max_over_mean"].get<double>() << "\n"
            << "predicted after re-cut:";
  for (double x : r.predicted_stage_seconds) std::cout << " " << x * 1e3;
  std::cout << "  max/mean " << j["predicted_max_over_mean"].get<double>() << "\n"
            << "cuts: " << cutsText(r.old_cuts) << " -> " << cutsText(r.new_cuts) << "\n"
            << "wrote " << from << "/rebalance.json\n"
            << "next: clusterize <the same planning flags> --cuts " << cutsText(r.new_cuts)
            << " --out NEW_NODE_DATA --resume-from " << from
            << "  (carries the checkpointed run over; provider --resume continues it)\n";
}

// The planning flags that --serve and planning share, into the options.
void applyPlanningFlags(ClusterizeFlags& f) {
  f.plan.granularity = clusterize::parseGranularity(f.granularity);
  if (f.microbatches_option->count() > 0) f.plan.microbatches = f.microbatches;
  if (f.optimizer_option->count() > 0) f.plan.optimizer = f.optimizer;
}

// The coordinator's options from the --serve flags given in other units or files.
void completeServeOptions(ClusterizeFlags& f) {
  f.serve.out = f.out_dir;
  f.serve.gather = std::chrono::milliseconds(int64_t(f.gather_s * 1000));
  f.serve.reach_timeout = std::chrono::milliseconds(int64_t(f.reach_timeout_s * 1000));
  f.serve.lost_after = std::chrono::milliseconds(int64_t(f.lost_after_s * 1000));
  f.serve.gone_after = std::chrono::milliseconds(int64_t(f.gone_after_s * 1000));
  if (!f.allow_keys_path.empty()) f.serve.allowed_keys = readAllowedKeys(f.allow_keys_path);
  f.serve.stop_requested = [] { return g_serve_stop.load(); };
  if (f.view_every_s < 0) f.view_every_s = ::isatty(STDOUT_FILENO) == 1 ? 1 : 10;
  f.serve.view_every = std::chrono::milliseconds(int64_t(f.view_every_s * 1000));
}

// Only the sync schedule takes a grown deal (trainer/DealChange.h): refuse the combination
// before anyone joins instead of leaving spares assigned to a deal nobody answers.
void refuseAsyncGrowth(const ClusterizeFlags& f, const clusterize::PreparedModel& prepared) {
  if (f.serve.grow && prepared.job.training.is_object() &&
      prepared.job.training.value("schedule", std::string("sync")) == "async")
    CAIRN_THROW(BadInput, f.plan.job_path.empty() ? std::string("the job") : f.plan.job_path,
                ": training_definition.schedule is \"async\", but --grow needs \"sync\" (an "
                "async run cannot take a new deal mid-run); drop --grow or use the sync schedule");
}

// --resume-from, checked before anything is profiled: another folder than --out, and a plan.
void checkResumeFrom(const std::string& resume_from, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::weakly_canonical(resume_from, ec) == fs::weakly_canonical(out_dir, ec))
    CAIRN_THROW(BadInput, "--out ", out_dir, " is the --resume-from folder: write the new "
                "plan to another folder (its stage files and checkpoints would be replaced)");
  if (!fs::is_regular_file(cairn::jobSpecPath(resume_from), ec))
    CAIRN_THROW(BadInput, cairn::jobSpecPath(resume_from),
                ": no such file: --resume-from needs a node_data folder written by clusterize");
}

// The run of --resume-from carried onto the new plan, checked; nothing written yet.
cairn::CarryResult carryFor(const ClusterizeFlags& f, const clusterize::ClusterizeResult& result) {
  std::vector<cairn::CarryStage> stages;
  for (const auto& node : result.nodes)
    stages.push_back(cairn::carryStageOf(node, result.stages.at(node.name)));
  return cairn::planCarry(f.resume_from, result.job,
                          f.plan.job_path.empty() ? std::string("the job built from the flags")
                                                  : f.plan.job_path,
                          stages, f.resume_step);
}

void writeCarried(const ClusterizeFlags& f, const cairn::CarryResult& carry) {
  const auto paths = cairn::writeCarry(f.out_dir, carry);
  std::cout << "carried step " << carry.step << " of " << f.resume_from << " (weights, "
            << "optimizer state, data cursor) into " << paths.size()
            << " checkpoint(s), e.g. " << paths.front() << "\n"
            << "continue with: provider --name <node> --node-data " << f.out_dir
            << " --resume (every node)\n";
}

}  // namespace

int runRebalance(const CLI::App& app, const ClusterizeFlags& f) {
  refuseOtherOptions(app, {f.rebalance, f.cluster_option, app.get_option("--plan-tolerance")},
                     "--rebalance takes only --cluster and --plan-tolerance (got ");
  const clusterize::RebalanceResult r =
      clusterize::rebalanceFromNodeData(f.rebalance_from, f.cluster, f.plan.plan_tolerance);
  const nlohmann::json j = r.toJson();
  cairn::writeJsonFile(f.rebalance_from + "/rebalance.json", j);
  printRebalance(r, j, f.rebalance_from);
  return 0;
}

int runMerge(const CLI::App& app, const ClusterizeFlags& f) {
  refuseOtherOptions(app, {f.merge, f.out, f.format_option, f.cluster_option, f.model},
                     "--merge takes only --out, --format, --cluster and --model (got ");
  clusterize::MergeOptions m;
  m.node_data = f.merge_from;
  m.model_path = f.plan.model_path;
  if (f.cluster_option->count() > 0) m.cluster = f.cluster;
  const clusterize::MergeFormat merge_format = clusterize::parseMergeFormat(f.format);
  const std::string target =
      f.out->count() > 0 ? f.out_dir
                         : f.merge_from + (merge_format == clusterize::MergeFormat::kSafetensors
                                               ? "/trained.safetensors"
                                               : "/trained.pt");
  const clusterize::MergedModel merged = clusterize::mergeTrainedStages(m);
  clusterize::saveMergedModel(merged, target, merge_format);
  std::cout << "merged " << merged.state.size() << " parameters and buffers from "
            << (m.cluster ? "cluster " + std::to_string(*m.cluster)
                          : std::to_string(merged.clusters.size()) +
                                " cluster(s) (floating point "
                                "averaged, integers maximum)")
            << " into " << target << " (" << f.format << ")\n";
  if (!merged.untouched.empty()) {
    std::cout << "kept from the model file (no stage uses them):";
    for (const auto& name : merged.untouched) std::cout << " " << name;
    std::cout << "\n";
  }
  return 0;
}

int runServe(ClusterizeFlags& f) {
  installServeStop();
  applyPlanningFlags(f);
  completeServeOptions(f);
  std::atomic<const cairn::coordinator::RunView*> view{nullptr};
  std::unique_ptr<cairn::coordinator::WebServer> web;
  if (!f.web_listen.empty()) {
    web = std::make_unique<cairn::coordinator::WebServer>(
        webAddress(f.web_listen),
        [&view] { return view ? view.load()->snapshot() : startingSnapshot(); },
        [&view] { return view ? view.load()->prometheus() : std::string(); }, "--web");
    std::cout << "web view: " << web->url() << std::endl;
  }
  clusterize::PreparedModel prepared = clusterize::prepareModel(f.plan);
  refuseAsyncGrowth(f, prepared);
  cairn::coordinator::Coordinator coordinator(f.serve, std::move(prepared));
  // Declared after the coordinator, so destroyed before it: no request reads a view that is
  // gone.
  struct StopWeb {
    cairn::coordinator::WebServer* web;
    ~StopWeb() { if (web) web->stop(); }
  } stop_web{web.get()};
  view = &coordinator.view();
  return coordinator.run();
}

int runPlan(ClusterizeFlags& f) {
  applyPlanningFlags(f);
  if (!f.resume_from.empty()) checkResumeFrom(f.resume_from, f.out_dir);
  const clusterize::ClusterizeResult result = clusterize::clusterize(f.plan);
  // Everything about the carry is checked before anything is written.
  std::optional<cairn::CarryResult> carry;
  if (!f.resume_from.empty()) carry = carryFor(f, result);
  clusterize::NodeDataWriter(f.out_dir).write(result.plan, result.job, result.nodes,
                                             result.stages);
  clusterize::printReport(result.plan, std::cout);
  std::cout << "wrote " << f.out_dir << "/plan.json, job.json and " << result.nodes.size()
            << " node folder(s) under " << f.out_dir << "/nodes\n";
  if (carry) writeCarried(f, *carry);
  return 0;
}

}  // namespace cairn::apps
