// What `provider --probe` measures about this machine, for its node_configs.json entry:
// memory and cores from hwloc (memory capped by the cgroup limit, as a container sees it), a
// compute speed from a short libtorch matmul benchmark (GFLOPS), the network bandwidth to a
// peer running `provider --probe-serve` (or over loopback when none is given), and each CUDA
// device libtorch sees (core/GpuFigures.h: name, memory, dense fp32/bf16 TFLOP/s, pinned
// host<->device copy GB/s). The volunteer's join carries the same figures.
// Thread-safety: free functions; each uses its own sockets and torch's thread pool.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/GpuFigures.h"

namespace cairn {

struct MachineProbe {
  double ram_gb = 0;             // usable memory: min(hwloc total, cgroup limit)
  int cores = 0;                 // physical cores (hwloc), falling back to processing units
  double compute_gflops = 0;     // float32 matmul, all of torch's threads
  double bandwidth_mbps = 0;     // payload megabits per second to the peer
  std::string bandwidth_peer;    // "loopback" or host:port
  std::vector<GpuFigures> gpus;  // probeGpus(): empty without a CUDA device
};

// hwloc's memory and core count, with the cgroup (v2 or v1) memory limit applied.
void probeMemoryAndCores(MachineProbe* probe);
// The compute probe of `provider --probe` and of a joining volunteer: 1024² sgemms for 1.5 s.
constexpr int kComputeProbeSize = 1024;
constexpr std::chrono::milliseconds kComputeProbeDuration{1500};
// Runs float32 sgemms of `size`×`size` for about `duration` (at least 5 rounds of 100 ms, shorter
// rounds for a duration under 0.5 s) on `threads` intra-op threads (0: the machine's physical
// cores, hwloc); returns GFLOPS, the median round (core/MatmulSpeed.h: the benchmark clusterize
// measures its host with).
double probeComputeGflops(int size = kComputeProbeSize,
                          std::chrono::milliseconds duration = kComputeProbeDuration,
                          int threads = 0);
// Sends `megabytes` in 1 MiB messages to a probe server at `peer` ("host:port") and waits for its
// acknowledgement; returns payload megabits per second. Without a peer, starts a server thread on
// 127.0.0.1 and measures loopback. Throws PeerLost naming the peer if it does not answer in time.
double probeBandwidthMbps(const std::optional<std::string>& peer, int megabytes = 256,
                          std::chrono::seconds timeout = std::chrono::seconds(30));
// Serves bandwidth probes on `address` ("host:port"; port "*": one the kernel picks) until
// `max_probes` have been answered (0: no limit) or nothing arrives for `idle_timeout`. Each probe:
// receive the announced number of messages, then acknowledge. `on_listening` (optional) is called
// with the bound "host:port" once the server listens.
void serveBandwidthProbes(const std::string& address, int max_probes = 0,
                          std::chrono::milliseconds idle_timeout = std::chrono::hours(24 * 365),
                          const std::function<void(const std::string&)>& on_listening = {});

// Each CUDA device libtorch sees (torch::cuda::device_count()), in its order: name and total
// memory from the CUDA driver (libcuda.so.1, loaded at run time), dense matmul TFLOP/s in float32
// (TF32 off, libtorch's default) and bfloat16 (torch::mm of 4096², median of 5 timed rounds after
// a warm-up), host->device and device->host GB/s (256 MiB from/to pinned host memory, median of
// 5). Empty when libtorch sees no device (a CPU-only libtorch such as Debian's, or no GPU or
// driver: then the driver is not even loaded), when the driver cannot be loaded or a measurement
// fails; `*none_reason` (optional) then says which. Takes a few seconds per GPU.
std::vector<GpuFigures> probeGpus(std::string* none_reason = nullptr);

// {"IP": "<address>", "benchmarks": {"ram": …, "bandwidth": …, "compute": …, "cores": …,
//  "gpus": [ … ]}}: "gpus" (core/GpuFigures.h) only when the probe found one.
nlohmann::json nodeConfigEntry(const MachineProbe& probe, const std::string& address);

// What `provider --probe` prints for people (on stderr; the entry goes to stdout): the CPU
// figures, then one line per GPU with its figures, or "GPUs: none (<gpus_none_reason>)".
std::string probeSummary(const MachineProbe& probe, const std::string& gpus_none_reason);

}  // namespace cairn
