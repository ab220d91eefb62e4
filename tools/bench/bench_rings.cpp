// bench_rings: one node in several rings at once, the case of clusters cut differently (cluster 0
// is one node holding the whole model; cluster 1 cuts it into K stages, so the hub shares stage i's
// tensors with spoke i: K rings of two). Each round is one RingClusterSync::synchronize()
// ("average" mode) on every process; the hub times it. Both ways of running the hub's rings are
// measured in the same invocation, side by side:
//   sequential   SyncOptions::concurrent_rings = false: ring after ring in ring id order
//   concurrent   the default: one thread per ring, all at once
// Processes: K + 1 on tcp://127.0.0.1 (one ZeroMQ I/O thread each, as the provider), exec'd from
// this binary. --link-mbps B emulates thin volunteer links (FaultyTransport's bandwidth fault:
// every message waits bytes / B in its sending thread), so each hub–spoke link carries at most B
// Mbit/s each way while the hub's own connection is not the limit; without it, loopback is limited
// only by the CPU. Every process adds its own constant to its tensors before a round (hub +1,
// spokes +3), so after r rounds every copy must be the initial value + 2r; the hub checks that it
// is. Prints one JSON line per way (tools/bench/run_all's "rings" table puts them side by side):
//   {"impl":"cairn-rings","mode":"concurrent","rings":K,"mb_per_ring":S,"link_mbps":B,"median_s":…,…}
//   build/tools/bench/bench_rings --rings 3 --mb 25 --rounds 5
//   build/tools/bench/bench_rings --rings 3 --mb 4 --rounds 3 --link-mbps 100
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/Error.h"
#include "core/MainGuard.h"
#include "node/testing/FaultyTransport.h"
#include "node/ring/RingClusterSync.h"
#include "node/transport/ZmqTransport.h"
#include "tools/bench/BenchProcesses.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_rings.
namespace cairn::bench::rings {

using namespace std::chrono;

namespace {

struct BenchOptions {
  int rings = 3;
  double mb = 25;  // per ring, float32, 10^6 bytes
  int warmup = 1;
  int rounds = 5;
  int port = 6400;
  int io_threads = 1;
  double link_mbps = 0;  // 0: loopback as it is
};

std::string nameOf(int process) { return process == 0 ? "hub" : "spoke" + std::to_string(process); }

// Stage i's tensors: one float32 weight of `mb` MB.
torch::Tensor initialWeight(int ring, int64_t elements) {
  return torch::arange(elements, torch::kFloat32).fmod(1000).div(1000).add(ring);
}

int runProcess(int process, bool concurrent, int port, const BenchOptions& o) {
  at::set_num_threads(1);
  const int64_t elements = static_cast<int64_t>(o.mb * 1e6 / 4);
  auto address = [&](int p) { return "127.0.0.1:" + std::to_string(port + p); };
  cairn::NodeSpec spec;
  spec.name = nameOf(process);
  spec.cluster = process == 0 ? 0 : 1;
  spec.address = address(process);
  torch::jit::Module stage("Stage");
  for (int i = 1; i <= o.rings; ++i) {
    if (process != 0 && process != i) continue;
    const std::string layer = "l" + std::to_string(i);
    torch::jit::Module m("Layer" + layer);
    m.register_parameter("weight", initialWeight(i, elements).requires_grad_(true), false);
    stage.register_module(layer, m);
    cairn::RingSpec ring;
    ring.id = "ring_" + std::to_string(i);
    ring.parameters = {layer + ".weight"};
    ring.members = {{nameOf(0), address(0), ""}, {nameOf(i), address(i), ""}};
    ring.rank = process == 0 ? 0 : 1;
    spec.rings.push_back(ring);
  }
  zmq::context_t context(o.io_threads);
  cairn::ZmqTransport transport(context, spec.name, "tcp://" + spec.address);
  cairn::FaultyTransport link(transport);
  link.setBandwidth(o.link_mbps * 1e6 / 8);
  cairn::Mailbox mailbox(link);
  cairn::SyncOptions sync;
  sync.mode = cairn::SyncMode::kAverage;
  sync.concurrent_rings = concurrent;
  cairn::RingClusterSync rings(mailbox, spec, sync, 1, seconds(60));
  rings.start(stage);
  std::vector<double> timed;
  const float own = process == 0 ? 1.0f : 3.0f;
  for (int round = 0; round < o.warmup + o.rounds; ++round) {
    {
      torch::NoGradGuard no_grad;
      for (const auto& p : stage.parameters()) p.add_(own);
    }
    const auto t0 = steady_clock::now();
    rings.synchronize();
    if (round >= o.warmup) timed.push_back(duration<double>(steady_clock::now() - t0).count());
  }
  const int total = o.warmup + o.rounds;
  for (const auto& p : stage.named_parameters(true)) {
    const int ring = std::stoi(p.name.substr(1, p.name.find('.') - 1));
    const torch::Tensor expected = initialWeight(ring, elements).add(2.0f * float(total));
    const double diff = (p.value.detach() - expected).abs().max().item<double>();
    if (diff > 1e-3)
      CAIRN_THROW(InternalError, spec.name, ": ", p.name, " differs from the expected average by ",
                  diff);
  }
  if (process == 0) {
    const double median = cairn::bench::median(timed);
    std::printf(
        "{\"impl\":\"cairn-rings\",\"mode\":\"%s\",\"rings\":%d,\"mb_per_ring\":%g,"
        "\"link_mbps\":%g,\"median_s\":%.6f,\"rounds_s\":[%s]}\n",
        concurrent ? "concurrent" : "sequential", o.rings, o.mb, o.link_mbps, median,
        cairn::bench::joined(timed).c_str());
    std::fflush(stdout);
  }
  transport.flushAndClose(seconds(5));
  return 0;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{
      "bench_rings: one node in K rings (clusters cut differently), rings one after another vs "
      "concurrently, over tcp loopback"};
  BenchOptions o;
  int process = -1;
  std::string mode;
  int port = -1;
  app.add_option("--rings", o.rings, "rings of the hub (one spoke process each)")
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
  app.add_option("--mb", o.mb, "MB (10^6 bytes) of float32 per ring")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed rounds")->capture_default_str();
  app.add_option("--rounds", o.rounds, "timed rounds (median reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--port", o.port, "first loopback port (2 x (rings + 1) are used)")
      ->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "ZeroMQ I/O threads per process")
      ->capture_default_str();
  app.add_option("--link-mbps", o.link_mbps,
                 "emulate hub-spoke links of this many Mbit/s each way (0: plain loopback)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--process", process, "(internal) run as this process");
  app.add_option("--mode", mode, "(internal) sequential | concurrent");
  app.add_option("--process-port", port, "(internal) first port of this way");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (process >= 0)
    return cairn::runGuarded("bench_rings",
                             [&] { return runProcess(process, mode == "concurrent", port, o); });

  int rc = 0;
  for (const bool concurrent : {false, true}) {
    const int first_port = o.port + (concurrent ? o.rings + 1 : 0);
    const int code = cairn::bench::runCopies(argc, argv, o.rings + 1, [&](int p) {
      return std::vector<std::string>{"--process", std::to_string(p), "--mode",
                                      concurrent ? "concurrent" : "sequential", "--process-port",
                                      std::to_string(first_port)};
    });
    if (code != 0 && rc == 0) rc = code;
  }
  return rc;
}

}  // namespace cairn::bench::rings
