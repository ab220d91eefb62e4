// bench_allreduce: cairn's ring all-reduce (ProcessGroup::allReduce, sum) of float32 tensors among
// N local processes over tcp://127.0.0.1 — the counterpart of allreduce_gloo.py, which measures
// torch.distributed's gloo the same way (tools/bench/allreduce_vs_gloo.sh runs both).
//
// Each round: every rank refills its tensor (untimed), a barrier, then the all-reduce is timed on
// every rank; the round's time is the slowest rank's. After `--warmup` untimed rounds, `--rounds`
// rounds are timed; the result is checked against the known sum. Rank 0 prints one JSON line per
// size: {"impl":"cairn","ranks":N,"bytes":B,"median_s":…,"algbw_GBps":B/median/1e9,"rounds_s":[…]}
//   build/tools/bench/bench_allreduce --ranks 4 --sizes-mb 100 --rounds 5

#include <cstdio>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "core/Error.h"
#include "core/MainGuard.h"
#include "node/collectives/ProcessGroup.h"
#include "node/transport/ZmqTransport.h"
#include "tools/bench/BenchProcesses.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_allreduce.
namespace cairn::bench::allreduce {

using namespace std::chrono;

namespace {

struct BenchOptions {
  int ranks = 2;
  std::vector<double> sizes_mb{100};
  int warmup = 1;
  int rounds = 5;
  int port = 5700;
  size_t segment_kb = 1024;
  int in_flight = 8;
  int io_threads = 2;
  int torch_threads = 1;
};

int runRank(int rank, const BenchOptions& o) {
  at::set_num_threads(o.torch_threads);
  std::vector<std::string> names;
  for (int r = 0; r < o.ranks; ++r) names.push_back("rank" + std::to_string(r));
  auto endpoint = [&](int r) { return "tcp://127.0.0.1:" + std::to_string(o.port + r); };
  zmq::context_t context(o.io_threads);
  cairn::TransportOptions transport_options;
  transport_options.send_high_water_mark = std::max(16, 2 * o.in_flight);
  transport_options.receive_high_water_mark = std::max(16, 2 * o.in_flight);
  cairn::ZmqTransport transport(context, names[rank], endpoint(rank), transport_options);
  for (int r = 0; r < o.ranks; ++r)
    if (r != rank) transport.addPeer(names[r], endpoint(r));
  cairn::Mailbox mailbox(transport);
  cairn::ProcessGroupOptions options;
  options.timeout = seconds(60);
  options.segment_bytes = o.segment_kb * 1024;
  options.max_in_flight = o.in_flight;
  cairn::ProcessGroup group(mailbox, "bench", names, names[rank], options);

  for (double size_mb : o.sizes_mb) {
    const int64_t elements = static_cast<int64_t>(size_mb * 1e6 / 4);
    torch::Tensor data = torch::empty({elements});
    torch::Tensor slowest = torch::empty({1}, torch::kFloat64);
    std::vector<double> timed;
    for (int round = 0; round < o.warmup + o.rounds; ++round) {
      data.fill_(float(rank + 1));
      group.barrier();
      const auto start = steady_clock::now();
      group.allReduce(data, cairn::ReduceOp::kSum);
      slowest.fill_(duration<double>(steady_clock::now() - start).count());
      group.allReduce(slowest, cairn::ReduceOp::kMax);
      if (round >= o.warmup) timed.push_back(slowest.item<double>());
    }
    const float expected = float(o.ranks) * float(o.ranks + 1) / 2;
    if (!torch::equal(data, torch::full_like(data, expected)))
      CAIRN_THROW(InternalError, "all-reduce result is wrong on ", names[rank]);
    if (rank == 0) {
      const double median = cairn::bench::median(timed);
      const double bytes = double(elements) * 4;
      std::printf(
          "{\"impl\":\"cairn\",\"ranks\":%d,\"bytes\":%.0f,\"median_s\":%.6f,\"algbw_GBps\":%.4f,"
          "\"segment_kb\":%zu,\"in_flight\":%d,\"rounds_s\":[%s]}\n",
          o.ranks, bytes, median, bytes / median / 1e9, o.segment_kb, o.in_flight,
          cairn::bench::joined(timed).c_str());
      std::fflush(stdout);
    }
  }
  group.barrier();
  const auto& st = group.stats();
  std::fprintf(stderr, "%s: %llu operations, %.3f s receiving, %.3f s sending, %.3f s completing\n",
               names[rank].c_str(), static_cast<unsigned long long>(st.operations),
               st.seconds_receiving, st.seconds_sending, st.seconds_completing);
  transport.flushAndClose(seconds(5));
  return 0;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"bench_allreduce: cairn ring all-reduce among local processes over tcp loopback"};
  BenchOptions o;
  int rank = -1;
  app.add_option("--ranks", o.ranks, "processes")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--sizes-mb", o.sizes_mb, "tensor sizes in MB (10^6 bytes), float32")
      ->delimiter(',')->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed rounds per size")->capture_default_str();
  app.add_option("--rounds", o.rounds, "timed rounds per size (median reported)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--port", o.port, "first of --ranks loopback ports")->capture_default_str();
  app.add_option("--segment-kb", o.segment_kb, "pipelined segment size")->capture_default_str();
  app.add_option("--in-flight", o.in_flight, "segments sent ahead of those received")
      ->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "ZeroMQ I/O threads per process")->capture_default_str();
  app.add_option("--torch-threads", o.torch_threads, "torch intra-op threads per process")
      ->capture_default_str();
  app.add_option("--rank", rank, "(internal) run as this rank");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (rank >= 0) return cairn::runGuarded("bench_allreduce", [&] { return runRank(rank, o); });

  // Launcher: one process per rank.
  return cairn::bench::runCopies(argc, argv, o.ranks, [](int r) {
    return std::vector<std::string>{"--rank", std::to_string(r)};
  });
}

}  // namespace cairn::bench::allreduce
