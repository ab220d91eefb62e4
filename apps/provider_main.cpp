// provider: the one binary a volunteer runs. See `provider --help` and docs/THREADS.md.
#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <pthread.h>
#include <thread>

#include "core/Log.h"
#include "core/MainGuard.h"
#include "core/NodeConfigs.h"
#include "core/OpCount.h"
#include "node/volunteer/Probe.h"
#include "node/pipeline/ProviderRun.h"
#include "node/volunteer/VolunteerRelay.h"
#include "node/volunteer/VolunteerRun.h"
#include "node/protocol/Coordination.h"
#include "trainer/Device.h"

namespace {

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

// Everything `provider` reads from its command line, by mode.
struct Cli {
  // --name: train one node of a plan.
  std::string name;
  std::string node_data = "node_data";
  bool resume = false;
  bool insecure = false;
  std::string device = "auto";
  // --probe / --probe-serve: know your machine.
  bool probe = false;
  std::string probe_address = "127.0.0.1:5500", probe_peer, probe_serve;
  int probe_megabytes = 256;
  CLI::Option* probe_megabytes_option = nullptr;  // given or not: its default differs by mode
  // --join: volunteers join a coordinator (`clusterize --serve`) instead of --name.
  std::string invite, listen, advertise, workdir = "cairn-volunteer";
  double coordinator_timeout_s = 60, result_wait_s = 600, upload_mbps = 50;
  CLI::Option* upload_mbps_option = nullptr;  // given or not: its default differs with --max-mbps
  double max_mbps = 0;  // --max-mbps: 0, no cap
  int metrics_queue = 20000;
  int cores = 0;          // --cores: 0, all of them
  double memory_gb = 0;   // --memory-gb: 0, all of it
  std::string active_hours;  // --active-hours: empty, at all hours
  bool relay = false;        // --relay: only relay (node/volunteer/VolunteerRelay.h)
  double relay_mbps = 0;     // --relay-mbps: 0, no cap
};

const char* const kDescription =
    "provider: run one node of a cairn plan: load nodes/<name>/{node.json,stage.pt} and "
    "job.json,\n"
    "connect to the pipeline neighbours, train, evaluate, and write "
    "nodes/<name>/trained_stage.pt\n"
    "and nodes/<name>/metrics.jsonl.\n"
    "Or join a coordinator as a volunteer: `provider --join <invite> [--listen HOST:PORT]` (no\n"
    "files to copy: the coordinator, `clusterize --serve`, sends the stage, node.json and\n"
    "job.json; see --join and docs/OPERATIONS.md \"Volunteers join\"). Behind a home router,\n"
    "leave --listen out: the volunteer joins dial-out only and opens every connection itself\n"
    "(docs/OPERATIONS.md \"Behind a home router\").\n\n"
    "Failures (docs/OPERATIONS.md): with training_definition.checkpoint_every > 0 each node\n"
    "checkpoints into nodes/<name>/checkpoints/. A pipeline neighbour lost mid-run (connection\n"
    "down for timeouts.peer_timeout_s; 1 s at most on a node sharing rings with other\n"
    "clusters, which would wait for it) pauses the cluster; it continues when the node is\n"
    "restarted with --resume, or exits 3 after timeouts.max_wait_s naming it.\n"
    "SIGINT/SIGTERM: stop at a step boundary, checkpoint, tell the neighbours, exit 0: with --name\n"
    "the whole cluster stops (restart every node with --resume); with --join only this volunteer\n"
    "leaves (it tells the coordinator, which gives its node to a spare; the rest of its cluster\n"
    "waits for the spare and resumes from that step). A second signal exits at once. A stop\n"
    "asked while a neighbour sends nothing gives the step up after timeouts.peer_timeout_s and\n"
    "leaves the same way (the cluster resumes from its newest common checkpoint).";

// The options are declared in the order `provider --help` lists them.
void addNodeOptions(CLI::App& app, Cli& cli) {
  app.add_option("--name", cli.name, "node name as in node_data/nodes/ (e.g. node_3); required to train");
  app.add_option("--node-data", cli.node_data, "folder written by clusterize")->capture_default_str();
}

// Know your machine: print this machine's node_configs.json entry (tools/make_node_configs
// gathers them), measuring bandwidth against a peer running --probe-serve, or loopback.
void addProbeOptions(CLI::App& app, Cli& cli) {
  app.add_flag("--probe", cli.probe,
               "print this machine's node_configs.json entry: RAM and cores (hwloc, cgroup limit "
               "applied), matmul GFLOPS, bandwidth (Mbps) to --peer or over loopback, and each\n"
               "CUDA GPU libtorch sees (name, memory, dense fp32/bf16 TFLOP/s, pinned host<->device "
               "GB/s);\na summary for people, GPUs included (or why none), goes to stderr");
  app.add_option("--address", cli.probe_address, "with --probe: the IP (host:port) to write in the entry")
      ->capture_default_str();
  app.add_option("--peer", cli.probe_peer, "with --probe: host:port of a `provider --probe-serve`");
  cli.probe_megabytes_option =
      app.add_option("--probe-megabytes", cli.probe_megabytes,
                     "MiB sent to measure bandwidth: with --probe to --peer (default 256), with "
                     "--join to the coordinator (default 8)")
          ->check(CLI::Range(1, 4096));
  app.add_option("--probe-serve", cli.probe_serve,
                 "serve bandwidth probes on host:port until interrupted (for --probe --peer)");
}

void addTrainingFlags(CLI::App& app, Cli& cli) {
  app.add_option("--device", cli.device,
                 "where the stage trains (with --name or --join): auto (the first CUDA GPU when "
                 "this build's libtorch\nand the machine have one, else the CPU), cpu, cuda or "
                 "cuda:N. A build against Debian's libtorch\nhas no CUDA: cuda exits 2 (README "
                 "\"GPU volunteers\"). Checkpoints are device-free: any device resumes them")
      ->capture_default_str();
  app.add_flag("--resume", cli.resume,
               "restart from the newest step for which every node of this cluster has a valid\n"
               "checkpoint (nodes/<name>/checkpoints/; the nodes agree on it over the wire). When\n"
               "the cluster holds no common checkpoint the node starts from step 0 with a warning");
  app.add_flag("--insecure", cli.insecure,
               "talk plain TCP without CurveZMQ: no encryption, anyone who reaches the port can "
               "send tensors.\nFor local debugging and plans without keys only; by default the "
               "node reads nodes/<name>/secret.key\nand admits only the public keys of its "
               "neighbours and ring peers listed in its node.json");
}

// provider --join … --relay: a volunteer that only relays (node/volunteer/VolunteerRelay.h).
void addRelayOptions(CLI::App& app, Cli& cli) {
  app.add_flag("--relay", cli.relay,
               "with --join and --listen: only relay, train nothing. Links between two volunteers "
               "who are both\nbehind home routers (dial-out only) go through a relay both dial; "
               "the coordinator routes\nsuch links through the relays volunteers offer (its own "
               "--relay only when none is there).\nA relay forwards messages sealed end to end "
               "between the two volunteers: it can neither\nread nor forge them. It must be "
               "reachable at --advertise (the coordinator checks at join)\nand costs its owner the "
               "bandwidth of the links it carries, twice (in and out). To train\nas well, run a "
               "second provider --join with its own --workdir (docs/OPERATIONS.md\n\"Behind a home "
               "router\")");
  app.add_option("--relay-mbps", cli.relay_mbps,
                 "with --relay: the most it forwards, in Mbit/s, all links together (messages wait "
                 "their turn\nin their link's queue). Default: no cap")
      ->check(CLI::Range(0.01, 1e6));
}

void addJoinOptions(CLI::App& app, Cli& cli) {
  app.add_option("--join", cli.invite,
                 "join the run of the coordinator whose invite (cairn-invite:1:…, printed by "
                 "`clusterize --serve`)\nthis is: probe this machine (RAM, cores, GFLOPS, "
                 "GPUs, bandwidth to the coordinator) and report\nthis build's libtorch version "
                 "(the coordinator refuses one older than the libtorch that wrote\nthe stage files), "
                 "make a CURVE key pair in --workdir once (the secret key never leaves this\n"
                 "machine), authenticate the coordinator by the "
                 "invite's key, wait (as a spare) for an assignment, train it, upload\nthe "
                 "trained stage. Exit 2 when the coordinator refuses (its reason is printed), 3 "
                 "when it\ndoes not answer (a wrong key in the invite looks the same). While it "
                 "trains, its metrics.jsonl records,\nrun plan and state changes stream to the "
                 "coordinator in the background (docs/OPERATIONS.md\n\"Watching a run\"). "
                 "@FILE reads the invite from FILE's first line (kept out of `ps`; the service "
                 "does this)");
  app.add_option("--listen", cli.listen,
                 "with --join: host:port this volunteer binds: the coordinator's reachability\n"
                 "check while joining, then its pipeline neighbours and ring peers (and PORT+1 for "
                 "those\nbehind routers). Without it the volunteer is dial-out only: nobody dials "
                 "it, it dials its\npeers, and it is placed next to reachable ones (one line at "
                 "join says what would make\nit reachable). Given but not answering the "
                 "coordinator's dial-back: dial-out only too");
  app.add_option("--advertise", cli.advertise,
                 "with --join: host:port peers and the coordinator dial to reach --listen (behind "
                 "a router:\nthe public address and forwarded port; default: --listen, which "
                 "must then not be 0.0.0.0)");
  app.add_option("--workdir", cli.workdir,
                 "with --join: this volunteer's folder: identity.key (0600), membership.json (the "
                 "name\nthe coordinator gave it, asked for again on a restart), node_data/ (the "
                 "assignment, its\ncheckpoints, trained_stage.pt, result.json)")
      ->capture_default_str();
  app.add_option("--coordinator-timeout-s", cli.coordinator_timeout_s,
                 "with --join: how long to wait for the coordinator's answer to the bandwidth "
                 "probe and to the join")
      ->check(CLI::Range(0.1, 86400.0))->capture_default_str();
  app.add_option("--result-wait-s", cli.result_wait_s,
                 "with --join: how long to offer the results to the coordinator (resent every 5 "
                 "s until\nacknowledged; then they stay in --workdir with a warning)")
      ->check(CLI::Range(0.0, 864000.0))->capture_default_str();
  app.add_option("--max-mbps", cli.max_mbps,
                 "with --join: the most this volunteer sends, in Mbit/s, all together: its "
                 "checkpoint uploads get\n--upload-mbps of it (default a quarter), its training "
                 "traffic (activations, gradients, ring\nsync) the rest, every message waiting "
                 "its turn. Default: no cap. What it receives is not capped")
      ->check(CLI::Range(0.01, 1e6));
  cli.upload_mbps_option =
      app.add_option("--upload-mbps", cli.upload_mbps,
                     "with --join: upload each new checkpoint to the coordinator in the background "
                     "at up to\nthis many Mbit/s (after B bytes, nothing for B*8/rate s; only the "
                     "newest is sent, one at\na time; training never waits for it); 0: uploads "
                     "off. With --max-mbps: its share, below it\n(default a quarter of it)")
          ->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--metrics-queue", cli.metrics_queue,
                 "with --join: how many of the trainer's records wait in memory for the "
                 "coordinator while it is\ndown or slow; when full the oldest is dropped (and "
                 "counted): training never waits for it")
      ->check(CLI::Range(10, 10000000))->capture_default_str();
  app.add_option("--cores", cli.cores,
                 "with --join: the most CPU cores this volunteer gives (default: all): its probe "
                 "reports at most\nthese to the coordinator and measures GFLOPS on that many "
                 "threads, and its stage runs at most\nthat many torch threads whatever job.json "
                 "asks")
      ->check(CLI::Range(1, 4096));
  app.add_option("--memory-gb", cli.memory_gb,
                 "with --join: the most RAM (GB) this volunteer gives (default: all the machine "
                 "has, cgroup limit\napplied): its probe reports at most this, so the planner "
                 "gives it no stage whose estimate\nneeds more, and it refuses (exit 2, telling "
                 "the coordinator why) an assignment that does")
      ->check(CLI::Range(0.1, 1e6));
  app.add_option("--active-hours", cli.active_hours,
                 "with --join: compute only between these local times, HH:MM-HH:MM (22:00-07:00: "
                 "the nights;\nthe end excluded). Outside them it waits, still running; at their "
                 "end it hands its node over\nas on a signal (checkpoint, `leaving`, a spare takes "
                 "the node) and waits for the next ones, then\njoins again (its node back if nobody "
                 "took it, else as a spare)");
}

// --config FILE: flags from a file (CLI11's config format: `key = value` per line, # comments,
// each key a long flag's name without --); the command line wins over the file. A key no flag
// has is an error, not ignored: a misspelt limit must not silently fall back to its default.
void addConfigOption(CLI::App& app) {
  app.set_config("--config", "",
                 "read flags from FILE, one `key = value` per line, each key a long flag's name "
                 "without --\n(listen = \"0.0.0.0:7100\"); flags given on the command line win. "
                 "The service cairn-provider@NAME\nreads /etc/cairn/volunteer.d/NAME.conf this "
                 "way (docs/OPERATIONS.md \"Running as a service\")");
  app.allow_config_extras(false);
}

// What --listen may be: host:port with a real port (the training transport binds the same one
// later). A wildcard host needs --advertise: peers cannot dial "0.0.0.0".
bool wildcardHost(const std::string& host) {
  return cairn::isWildcardHost(host);
}

// --listen checked, and the address peers and the coordinator dial: --advertise, by default
// --listen (then not a wildcard); empty without either (a dial-out-only volunteer).
std::string advertisedAddress(const std::string& listen, std::string advertise) {
  if (listen.empty()) {  // dial-out only (docs/OPERATIONS.md "Behind a home router")
    if (!advertise.empty())
      CAIRN_THROW(BadInput, "--advertise ", advertise, " needs --listen HOST:PORT: the address "
                  "this volunteer binds, which --advertise names from outside; without both it "
                  "joins dial-out only");
    return "";
  }
  std::string host;
  int port = 0;
  cairn::parseHostPort(listen, "command line", "--listen", &host, &port);
  if (advertise.empty()) {
    if (wildcardHost(host))
      CAIRN_THROW(BadInput, "--listen ", listen, " binds every interface, which peers cannot "
                  "dial: give --advertise HOST:PORT, the address peers and the coordinator "
                  "reach this machine at (e.g. its public IP and forwarded port)");
    advertise = listen;
  }
  cairn::parseHostPort(advertise, "command line", "--advertise", &host, &port);
  if (wildcardHost(host))
    CAIRN_THROW(BadInput, "--advertise ", advertise,
                " is not an address peers can dial (give this machine's IP or name)");
  return advertise;
}

// --join's argument: the invite itself, or @FILE: the first line of FILE, without surrounding
// whitespace (the service, cairn-provider@.service, passes its credential file this way so the
// token is not on a command line every user of the machine can read).
std::string inviteText(const std::string& argument) {
  if (argument.empty() || argument[0] != '@') return argument;
  const std::string path = argument.substr(1);
  std::ifstream in(path);
  if (!in)
    CAIRN_THROW(BadInput, "--join ", argument, ": cannot read ", path, " (", std::strerror(errno),
                ")");
  std::string line;
  std::getline(in, line);
  const size_t begin = line.find_first_not_of(" \t\r");
  const size_t end = line.find_last_not_of(" \t\r");
  if (begin == std::string::npos)
    CAIRN_THROW(BadInput, "--join ", argument, ": ", path, " holds no invite on its first line");
  return line.substr(begin, end - begin + 1);
}

int runJoin(const Cli& cli) {
  cairn::VolunteerConfig config;
  if (!cli.active_hours.empty())  // the flags are checked before the invite
    config.active_hours = cairn::ActiveHours::parse(cli.active_hours, "--active-hours");
  config.upload_mbps = cli.upload_mbps;
  if (cli.max_mbps > 0) {  // one set of caps: uploads a share of --max-mbps, training the rest
    config.max_mbps = cli.max_mbps;
    if (cli.upload_mbps_option->count() == 0) config.upload_mbps = cli.max_mbps / 4;
    if (config.upload_mbps >= cli.max_mbps)
      CAIRN_THROW(BadInput, "--upload-mbps ", config.upload_mbps, " leaves nothing of --max-mbps ",
                  cli.max_mbps, " for training: give the checkpoint uploads a share below it");
  }
  config.metrics.capacity = size_t(cli.metrics_queue);
  config.invite = cairn::parseInvite(inviteText(cli.invite));
  config.advertise = advertisedAddress(cli.listen, cli.advertise);
  config.listen = cli.listen;
  config.workdir = cli.workdir;
  config.coordinator_timeout = std::chrono::milliseconds(int64_t(cli.coordinator_timeout_s * 1000));
  config.result_wait = std::chrono::milliseconds(int64_t(cli.result_wait_s * 1000));
  config.probe_megabytes = cli.probe_megabytes_option->count() > 0 ? cli.probe_megabytes : 8;
  config.stop_requested = [] { return g_stop.load(); };
  config.device = cli.device;
  config.cores = cli.cores;
  config.memory_gb = cli.memory_gb;
  config.clock = cairn::volunteerClock();
  if (std::getenv("CAIRN_TEST_CLOCK")) config.hours_poll = std::chrono::milliseconds(200);
  if (cli.relay_mbps > 0 && !cli.relay)
    CAIRN_THROW(BadInput, "--relay-mbps is for --relay (the cap on what this volunteer relays)");
  if (cli.relay) {
    if (cli.listen.empty())
      CAIRN_THROW(BadInput, "--relay needs --listen HOST:PORT (and --advertise HOST:PORT when "
                  "volunteers dial another address): both ends of a relayed link dial the relay");
    if (!cli.active_hours.empty())
      CAIRN_THROW(BadInput, "--relay cannot be combined with --active-hours: a relay that goes away "
                  "moves its links to another relay, which the training waits for");
    config.relay_mbps = cli.relay_mbps;
    return cairn::runRelayVolunteer(config);
  }
  cairn::resolveDevice(cli.device, "--device");  // a device this machine lacks: exit 2 before joining
  return cairn::runVolunteer(config);
}

// provider --join: a volunteer.
int joinMode(const Cli& cli) {
  if (!cli.name.empty() || cli.resume || cli.insecure || cli.probe || !cli.probe_serve.empty()) {
    std::fprintf(stderr, "provider: error: --join cannot be combined with --name, --resume, "
                         "--insecure, --probe or --probe-serve (the coordinator assigns the "
                         "node; volunteers always use CurveZMQ)\n");
    return 2;
  }
  installStopHandling();  // before any thread starts
  return cairn::runGuarded("provider", [&] { return runJoin(cli); });
}

// The first of --join's own options given without --join (nullptr: none).
const char* joinOptionGiven(const CLI::App& app) {
  for (const char* flag : {"--listen", "--advertise", "--workdir", "--coordinator-timeout-s",
                           "--result-wait-s", "--upload-mbps", "--metrics-queue", "--cores",
                           "--memory-gb", "--active-hours", "--max-mbps", "--relay", "--relay-mbps"})
    if (app.count(flag) > 0) return flag;
  return nullptr;
}

int serveProbes(const std::string& address) {
  std::string host;
  int port = 0;
  cairn::parseHostPort(address, "command line", "--probe-serve", &host, &port);
  cairn::serveBandwidthProbes(address);
  return 0;
}

int printProbe(const Cli& cli) {
  std::string host;
  int port = 0;
  cairn::parseHostPort(cli.probe_address, "command line", "--address", &host, &port);
  if (!cli.probe_peer.empty()) cairn::parseHostPort(cli.probe_peer, "command line", "--peer", &host, &port);
  cairn::MachineProbe measured;
  cairn::probeMemoryAndCores(&measured);
  measured.compute_gflops = cairn::probeComputeGflops();
  measured.bandwidth_mbps = cairn::probeBandwidthMbps(
      cli.probe_peer.empty() ? std::nullopt : std::optional<std::string>(cli.probe_peer),
      cli.probe_megabytes);
  measured.bandwidth_peer = cli.probe_peer.empty() ? "loopback" : cli.probe_peer;
  std::string no_gpus;
  measured.gpus = cairn::probeGpus(&no_gpus);
  // The entry on stdout (redirected into a file for tools/make_node_configs), the summary on stderr.
  std::fprintf(stderr, "%s", cairn::probeSummary(measured, no_gpus).c_str());
  std::printf("%s\n", cairn::nodeConfigEntry(measured, cli.probe_address).dump(2).c_str());
  return 0;
}

// provider --probe / --probe-serve.
int probeMode(const Cli& cli) {
  return cairn::runGuarded("provider", [&] {
    if (!cli.probe_serve.empty()) return serveProbes(cli.probe_serve);
    return printProbe(cli);
  });
}

// provider --name: one node of a plan in --node-data.
int trainMode(const Cli& cli) {
  if (cli.name.empty()) {
    std::fprintf(stderr, "provider: error: --name is required (or --probe / --probe-serve)\n");
    return 2;
  }
  installStopHandling();  // before any thread starts
  return cairn::runGuarded("provider", [&] {
    cairn::ProviderRunOptions options;
    options.node_data = cli.node_data;
    options.name = cli.name;
    options.resume = cli.resume;
    options.insecure = cli.insecure;
    options.device = cli.device;
    cairn::resolveDevice(cli.device, "--device");  // exit 2 before any socket opens
    options.stop_requested = [] { return g_stop.load(); };
    const auto op_count = cairn::OpCount::fromEnvironment(cli.name);  // CAIRN_COUNT_OPS
    cairn::runProvider(options);
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription};
  Cli cli;
  addNodeOptions(app, cli);
  addProbeOptions(app, cli);
  addTrainingFlags(app, cli);
  addJoinOptions(app, cli);
  addRelayOptions(app, cli);
  addConfigOption(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ConfigError& e) {  // a key no flag has, a line that is not `key = value`
    std::fprintf(stderr, "provider: error: --config %s: %s (keys are the long flags' names "
                 "without --, e.g. listen = \"0.0.0.0:7100\")\n",
                 app.get_config_ptr()->as<std::string>().c_str(), e.what());
    return 2;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!cli.invite.empty()) return joinMode(cli);
  if (const char* option = joinOptionGiven(app)) {
    std::fprintf(stderr, "provider: error: %s is for --join\n", option);
    return 2;
  }
  if (cli.probe || !cli.probe_serve.empty()) return probeMode(cli);
  return trainMode(cli);
}
