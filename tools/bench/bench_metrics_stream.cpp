// The trainer thread's cost of streaming metrics (provider --join): the time VolunteerMetrics::
// record() takes per step record (a realistic metrics.jsonl line), while its sender thread streams
// to a coordinator that acknowledges (an in-process CurveZMQ ROUTER), and while the coordinator is
// down (nothing listens: the queue fills and drops its oldest). Prints median / p99 / max in
// nanoseconds per record; docs/OPERATIONS.md "Watching a run" quotes it.
//   bench_metrics_stream [--records N] [--capacity C] [--step-us U]
// --step-us 0 (default) pushes in bursts (64 records, then 200 µs): far more records per second
// than a trainer writes, so batches are full (1,000 records) and the sender holds the queue's lock
// longer; --step-us 1000 pushes one record per millisecond, a fast trainer's rate.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/volunteer/VolunteerMetrics.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_metrics_stream.
namespace cairn::bench::metrics_stream {

using namespace cairn;
using Clock = std::chrono::steady_clock;

namespace {

nlohmann::json stepRecord(int64_t step) {
  return {{"step", step}, {"epoch", step / 1875}, {"loss", 0.4321 + 1.0 / double(step + 1)},
          {"lr", 0.003}, {"samples_per_s", 812.5 + double(step % 7)}, {"compute_s", 0.0123},
          {"send_s", 0.0011}, {"wait_s", 0.0234}, {"sample_checksum", 1234567890123ull + uint64_t(step)},
          {"sync_s", 0.0}};
}

void report(const char* what, std::vector<double> ns) {
  std::sort(ns.begin(), ns.end());
  std::printf("%-34s median %6.0f ns  p99 %7.0f ns  max %9.0f ns  (%zu records)\n", what,
              ns[ns.size() / 2], ns[ns.size() * 99 / 100], ns.back(), ns.size());
}

std::vector<double> measure(VolunteerMetrics& metrics, int records, int step_us) {
  std::vector<double> ns;
  ns.reserve(size_t(records));
  for (int64_t step = 1; step <= records; ++step) {
    const nlohmann::json r = stepRecord(step);
    const std::string line = r.dump();  // MetricsLog dumps it once for metrics.jsonl anyway
    const auto t0 = Clock::now();
    metrics.record(r, line);
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
    if (step_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(step_us));
    else if (step % 64 == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return ns;
}

// The same loop copying the line into a vector instead: what a timed string copy costs on this
// machine (its tail is the machine's: preemption, page faults), for comparison.
std::vector<double> baseline(int records, int step_us) {
  std::vector<double> ns;
  std::vector<std::string> kept;
  kept.reserve(size_t(records));
  for (int64_t step = 1; step <= records; ++step) {
    const std::string line = stepRecord(step).dump();
    const auto t0 = Clock::now();
    kept.push_back(line);
    ns.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
    if (step_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(step_us));
    else if (step % 64 == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return ns;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app("trainer-thread cost of VolunteerMetrics::record per step record");
  int records = 20000;
  size_t capacity = 20000;
  int step_us = 0;
  app.add_option("--records", records)->check(CLI::Range(100, 10000000));
  app.add_option("--capacity", capacity)->check(CLI::Range(size_t(1), size_t(100000000)));
  app.add_option("--step-us", step_us, "microseconds between records (0: bursts)")
      ->check(CLI::Range(0, 1000000));
  CLI11_PARSE(app, argc, argv);
  MetricsStreamOptions options;
  options.capacity = capacity;

  report("baseline (copying the line only):", baseline(records, step_us));
  // A coordinator that acknowledges every batch, on its own thread.
  const CurveKeyPair keys = generateCurveKeyPair();
  zmq::context_t server_context;
  ZapAuthenticator zap(server_context, ZapAuthenticator::AnyKey{});
  std::string bound;
  zmq::socket_t router = coordinationServer(server_context, keys, "127.0.0.1:0", 1 << 20, &bound);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> taken{0};
  std::thread server([&] {
    while (!stop) {
      auto in = recvRouted(router, std::chrono::milliseconds(50));
      if (!in) continue;
      std::string why;
      auto m = decodeToCoordinator(in->frames, 1 << 20, &why);
      if (!m || !std::holds_alternative<MetricsBatch>(*m)) continue;
      const auto& b = std::get<MetricsBatch>(*m);
      taken += int64_t(b.records.size());
      sendRouted(router, in->routing_id, encode(MetricsAck{b.name, b.stream, b.seq + int64_t(b.records.size())}));
    }
  });
  Invite invite;
  invite.host = "127.0.0.1";
  invite.port = std::stoi(bound.substr(bound.rfind(':') + 1));
  invite.coordinator_key = keys.public_key;
  invite.token = std::string(32, '0');
  zmq::context_t context;
  {
    VolunteerMetrics up(context, generateCurveKeyPair(), invite, "node_1", options);
    report("coordinator up (acknowledging):", measure(up, records, step_us));
    up.finish(std::chrono::seconds(30));
    std::printf("  the coordinator took %lld records; the queue dropped %lld (capacity %zu)\n",
                (long long)taken.load(), (long long)up.queue().dropped(), capacity);
  }
  stop = true;
  server.join();
  router.close();
  // Nothing listens on this port any more: every send is refused at once, the queue fills.
  {
    VolunteerMetrics down(context, generateCurveKeyPair(), invite, "node_1", options);
    report("coordinator down (queue filling):", measure(down, records, step_us));
    std::printf("  queued %zu, dropped %lld (capacity %zu)\n", down.queue().size(),
                (long long)down.queue().dropped(), capacity);
  }
  return 0;
}

}  // namespace cairn::bench::metrics_stream
