#include "apps/ClusterizeFlags.h"

namespace cairn::apps {
namespace {

// The model, the nodes, the output folder and the job.json built from flags.
void declareModelAndJob(CLI::App& app, ClusterizeFlags& f) {
  f.model = app.add_option("--model", f.plan.model_path,
                           "TorchScript model file (torch.jit.save / Module::save); "
                           "required for planning; with --merge: default plan.json's");
  app.add_option("--weights", f.plan.weights_path,
                 "safetensors file of initial weights loaded into the model "
                 "before cutting (names, shapes and dtypes must match the "
                 "model's parameters and buffers); default: the model's own");
  app.add_option("--nodes", f.plan.nodes_path,
                 "node_configs.json (Ravnest format: IP, benchmarks.ram GB, "
                 "benchmarks.bandwidth Mbps, optional benchmarks.compute GFLOPS and "
                 "benchmarks.gpus: with a GPU node, whole models per GPU are weighed against "
                 "cutting, docs/CLUSTERIZE.md \"GPU nodes\")")
      ->capture_default_str();
  f.out = app.add_option("--out", f.out_dir,
                         "output folder; only files clusterize wrote are replaced. "
                         "With --merge: the model file to write (default "
                         "NODE_DATA/trained.pt, or trained.safetensors)")
              ->capture_default_str();
  app.add_option("--job", f.plan.job_path,
                 "job.json to use (validated; its training_definition.optimizer "
                 "and .microbatches apply unless the flags are given; .wire.activations sets the "
                 "bytes the time estimate counts per transfer; with GPU nodes .precision picks their fp32 or bf16 "
                 "TFLOP/s and .sync, .local_steps, .wire.sync the sync cost in the whole-model-per-GPU "
                 "estimate); default: built from the flags below");
  app.add_option("--job-id", f.plan.job_id, "job id when job.json is built from flags")
      ->capture_default_str();
  app.add_option("--data", f.plan.data_location, "data location when job.json is built from flags")
      ->capture_default_str();
  app.add_option("--data-format", f.plan.data_format,
                 "data format: idx, images, safetensors, npy or tokens")
      ->capture_default_str();
  app.add_option("--loss", f.plan.loss, "loss_fn written to job.json")->capture_default_str();
  app.add_option("--lr", f.plan.learning_rate, "learning rate written to job.json")
      ->capture_default_str();
  app.add_option("--local-steps", f.plan.local_steps, "local_steps written to job.json")
      ->capture_default_str();
}

// How the planner cuts and places: clusters, tolerance, units, example inputs, memory estimate,
// fixed cuts, profiling.
void declarePlanner(CLI::App& app, ClusterizeFlags& f) {
  app.add_option("--clusters", f.plan.clusters,
                 "number of clusters; 0 = as many as the nodes' memory allows")
      ->capture_default_str();
  app.add_option("--plan-tolerance", f.plan.plan_tolerance,
                 "splits whose slowest stage is within this fraction of the optimum count as equal "
                 "and the canonical one is taken (each node in order the longest range), so timing "
                 "noise below it does not move the cuts; 0 = the exact optimum")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option_function<double>(
         "--host-gflops", [&f](double value) { f.plan.host_gflops = value; },
         "this machine's float32 GFLOPS, the yardstick of GPU nodes (benchmarks.gpus): a node "
         "runs the profiled seconds x this / its GFLOPS (its first GPU's fp32_tflops x 1000, "
         "bf16_tflops x 1000 for a bf16 job; a CPU node's compute). Default: measured with a "
         "1.5 s sgemm (as provider --probe) when a node has a GPU; give it for plans that do "
         "not depend on this machine's load")
      ->check(CLI::Range(0.001, 1.0e6));
  app.add_option("--seed", f.plan.seed, "seed for tie-breaking among equal nodes and for example inputs")
      ->capture_default_str();
  app.add_option("--granularity", f.granularity,
                 "units to cut between: top (top-level forward nodes) or "
                 "expand-containers (also the elements of child nn.Sequential)")
      ->capture_default_str();
  app.add_option("--input-shape", f.plan.input_shapes,
                 "example input shape, e.g. 64,1,28,28 (first dim = "
                 "micro-batch size); repeat once per model input");
  app.add_option("--input-dtype", f.plan.input_dtypes,
                 "example input dtype (float32, float64, float16, "
                 "bfloat16, int64, int32, uint8, bool); once for all "
                 "inputs or once per input; integer inputs are zeros")
      ->capture_default_str();
  app.add_option("--example", f.plan.example_path,
                 "torch.save'd example input (a tensor, or a tuple/list "
                 "of inputs) instead of --input-shape");
  f.microbatches_option = app.add_option("--microbatches", f.microbatches,
                                         "micro-batches in flight per step (memory "
                                         "estimate); default: job.json's, else")
                              ->capture_default_str();
  f.optimizer_option = app.add_option("--optimizer", f.optimizer,
                                      "sgd, momentum, adam or adamw (optimizer state "
                                      "in the memory estimate); default: job.json's, else")
                           ->capture_default_str();
  app.add_option("--cuts", f.plan.cuts,
                 "fix the stage boundaries instead of letting the planner choose: unit "
                 "indices where stages 1, 2, ... begin, e.g. --cuts 4,9 (3 stages); each "
                 "cluster gets exactly these stages, the planner still places them on nodes. "
                 "plan.json's \"units\" lists the units and which are valid cuts; a "
                 "parameter used on both sides of a cut (tied embeddings) gets a copy in each "
                 "stage, kept equal every step (plan.json \"shared_parameters\"; with the "
                 "async schedule it stays in one stage)")
      ->delimiter(',');
  app.add_option("--profile-runs", f.plan.profile.timed_runs,
                 "timed forward+backward runs per unit (the fastest is kept)")
      ->capture_default_str();
}

// Serve mode: volunteers join by invite instead of --nodes (coordinator/, docs/OPERATIONS.md).
// The listening address, how many volunteers to wait for, and when one counts as lost.
void declareServe(CLI::App& app, ClusterizeFlags& f) {
  f.serve_option = app.add_option(
      "--serve", f.serve.listen,
      "coordinator mode: listen on HOST:PORT for volunteers (`provider --join INVITE`) instead "
      "of reading --nodes; print the invite, plan once enough have joined, send each its stage, "
      "keep the rest as spares, collect the trained stages and merge them into "
      "OUT/trained.pt and OUT/trained.safetensors. State in OUT/coordinator.db: run the same "
      "command again to pick the run up");
  app.add_option("--advertise", f.serve.advertise,
                 "with --serve: the HOST:PORT volunteers dial (default: the --serve address; "
                 "required when it is 0.0.0.0)")
      ->needs(f.serve_option);
  app.add_option("--min-volunteers", f.serve.min_volunteers,
                 "with --serve: plan once this many volunteers have joined")
      ->check(CLI::Range(1, 100000))->capture_default_str()->needs(f.serve_option);
  app.add_option("--max-volunteers", f.serve.max_volunteers,
                 "with --serve: plan at once when this many have joined (default: "
                 "--min-volunteers); between the two, wait up to --gather-s for more")
      ->check(CLI::Range(0, 100000))->needs(f.serve_option);
  app.add_option("--gather-s", f.gather_s,
                 "with --serve: seconds to wait for more volunteers once --min-volunteers joined")
      ->check(CLI::Range(0.0, 86400.0))->capture_default_str()->needs(f.serve_option);
  app.add_option("--reach-timeout-s", f.reach_timeout_s,
                 "with --serve: seconds a joining volunteer's advertised address has to answer "
                 "the coordinator's dial-back")
      ->check(CLI::Range(0.1, 600.0))->capture_default_str()->needs(f.serve_option);
  app.add_option("--lost-after-s", f.lost_after_s,
                 "with --serve: a placed volunteer whose heartbeats stop this long is lost; a "
                 "waiting spare takes its node over from the newest checkpoint the coordinator "
                 "holds, and its neighbours and ring peers are sent its new address and key")
      ->check(CLI::Range(1.0, 86400.0))->capture_default_str()->needs(f.serve_option);
  app.add_option("--gone-after-s", f.gone_after_s,
                 "with --serve: a placed volunteer whose every connection to the coordinator "
                 "closed (its process ended: killed, crashed, rebooted) and that sent nothing "
                 "since is lost after this many seconds, without waiting out --lost-after-s (a "
                 "frozen or cut-off one keeps its connections open and waits it out); a spare "
                 "gone so is passed over. 0: off")
      ->check(CLI::Range(0.0, 86400.0))->capture_default_str()->needs(f.serve_option);
  auto* relay = app.add_option(
      "--relay", f.serve.relay_listen,
      "with --serve: relay on HOST:PORT the links between two dial-out-only volunteers (each "
      "behind its own home router) that no placement next to a reachable one avoids: both dial "
      "it and every message is sealed end to end between them. Such links then pass through "
      "the coordinator (on their hot path; they pause while it restarts), but only while no "
      "volunteer relay (provider --join ... --relay) is alive: it is the fallback, and takes the "
      "links of a volunteer relay that is lost. Off by default: without it and without a "
      "volunteer relay such a plan waits for more reachable volunteers or a relay, and a "
      "dial-out-only spare cannot take over a node placed reachable that has a dial-out-only peer")
      ->needs(f.serve_option);
  app.add_option("--relay-advertise", f.serve.relay_advertise,
                 "with --relay: the HOST:PORT volunteers dial to reach it (default: --relay; "
                 "required when that is 0.0.0.0)")
      ->needs(relay);
}

// Serve mode, continued: growth, who may join, and the live views.
void declareServeRun(CLI::App& app, ClusterizeFlags& f) {
  app.add_flag("--grow", f.serve.grow,
               "with --serve: while the run trains, spares (reachable ones first; dial-out-only ones "
               "next to each other only with a relay) that can hold one more whole pipeline of the "
               "planned cut form a new cluster: the data is dealt over one more cluster "
               "from the epoch after the newest a Root reported, the new cluster starts at that "
               "epoch's first step with its ring peers' weights (docs/OPERATIONS.md \"Growing\"); "
               "needs data.chunks >= the number of clusters and the sync schedule (an async job "
               "is refused, exit 2); off by default")
      ->needs(f.serve_option);
  app.add_option("--max-clusters", f.serve.max_clusters,
                 "with --grow: grow to at most this many clusters (0: no limit)")
      ->check(CLI::Range(0, 100000))->capture_default_str()->needs(f.serve_option);
  app.add_option("--keep-spares", f.serve.keep_spares,
                 "with --grow: spares that growth leaves waiting to replace lost volunteers")
      ->check(CLI::Range(0, 100000))->capture_default_str()->needs(f.serve_option);
  app.add_option("--token", f.serve.token,
                 "with --serve: the invite token (32-128 lowercase hex digits); default: the "
                 "stored one, else a fresh random one")
      ->needs(f.serve_option);
  app.add_option("--allow-keys", f.allow_keys_path,
                 "with --serve: a file of volunteer public keys (Z85, one per line; # comments): "
                 "only these may join, token or not")
      ->needs(f.serve_option);
  app.add_option("--invite-file", f.serve.invite_file,
                 "with --serve: also write the invite to this file")
      ->needs(f.serve_option);
  app.add_option("--view-every-s", f.view_every_s,
                 "with --serve: the live view of the run on stdout (per cluster step, loss, "
                 "samples/s, ETA; per node role, state, heartbeat age, time split; events) every "
                 "this many seconds: redrawn in place on a terminal, plain lines otherwise; "
                 "0: off (default: 1 on a terminal, 10 otherwise)")
      ->check(CLI::Range(0.0, 86400.0))->needs(f.serve_option);
  app.add_option("--web", f.web_listen,
                 "with --serve: serve the run's read-only live view on PORT or HOST:PORT: the "
                 "page (charts of loss, evaluation, throughput and each node's time split; the "
                 "clusters as chains of nodes; events), /api/state (JSON) and /metrics "
                 "(Prometheus). A bare PORT binds 127.0.0.1 only; name a host (e.g. "
                 "0.0.0.0:8080) to let other machines see it: the page has no login. Port 0: any "
                 "free port. The URL is printed. Default: off")
      ->needs(f.serve_option);
}

// After (or during) training: --merge, --rebalance, and --resume-from for the plan that follows.
void declareAfterTraining(CLI::App& app, ClusterizeFlags& f) {
  f.merge = app.add_option("--merge", f.merge_from,
                           "merge mode: read NODE_DATA/plan.json and every "
                           "node's trained_stage.pt and write the trained "
                           "original model to --out; no planning");
  f.format_option = app.add_option("--format", f.format,
                                   "with --merge: torchscript (loads with "
                                   "torch.jit.load) or safetensors (original "
                                   "parameter and buffer names)")
                        ->capture_default_str()
                        ->needs(f.merge);
  f.cluster_option = app.add_option("--cluster", f.cluster,
                                    "with --merge: take cluster N's weights; "
                                    "default: average floating-point tensors "
                                    "over all clusters, maximum of integer ones; "
                                    "with --rebalance: the cluster to re-cut (default 0)");
  f.rebalance = app.add_option(
      "--rebalance", f.rebalance_from,
      "rebalance mode: read NODE_DATA/plan.json and each stage's NODE_DATA/nodes/<node>/"
      "metrics.jsonl, spread every stage's median compute_s over its units in proportion to the "
      "profiled unit times, cut again with the planner (--plan-tolerance applies), print the "
      "measured and predicted stage times and the new --cuts, and write NODE_DATA/"
      "rebalance.json; no stage files are changed: re-plan with --cuts and --resume-from "
      "NODE_DATA to continue the run at the new cut (docs/CLUSTERIZE.md \"Rebalancing from "
      "measurement\")");
  f.resume_from_option = app.add_option(
      "--resume-from", f.resume_from,
      "planning: carry the run of OLD_NODE_DATA (a plan of the same model and job, e.g. before a "
      "--rebalance re-cut) into this plan: from the newest step every old node has a checkpoint "
      "of, its weights, buffers, optimizer state (by parameter name), step, data cursor and lr "
      "schedule position become a checkpoint per new node in OUT/nodes/<node>/checkpoints; start "
      "the new providers with --resume. Same number of clusters; --out must be another folder "
      "(docs/CLUSTERIZE.md \"Carrying the run over\")");
  app.add_option("--resume-step", f.resume_step,
                 "with --resume-from: carry this step instead of the newest common one")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 60))
      ->needs(f.resume_from_option);
}

}  // namespace

ClusterizeFlags::ClusterizeFlags(CLI::App& app) {
  plan.nodes_path = "node_data/node_configs.json";
  declareModelAndJob(app, *this);
  declarePlanner(app, *this);
  declareServe(app, *this);
  declareServeRun(app, *this);
  declareAfterTraining(app, *this);
}

}  // namespace cairn::apps
