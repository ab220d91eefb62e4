// What `provider --probe` measures about this machine, for its node_configs.json entry:
// memory and cores from hwloc (memory capped by the cgroup limit, as a container sees it), a
// compute speed from a short libtorch matmul benchmark (GFLOPS), and the network bandwidth to a
// peer running `provider --probe-serve` (or over loopback when none is given).
// Thread-safety: free functions; each uses its own sockets and torch's thread pool.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace cairn {

struct MachineProbe {
  double ram_gb = 0;             // usable memory: min(hwloc total, cgroup limit)
  int cores = 0;                 // physical cores (hwloc), falling back to processing units
  double compute_gflops = 0;     // float32 matmul, all of torch's threads
  double bandwidth_mbps = 0;     // payload megabits per second to the peer
  std::string bandwidth_peer;    // "loopback" or host:port
};

// hwloc's memory and core count, with the cgroup (v2 or v1) memory limit applied.
void probeMemoryAndCores(MachineProbe* probe);
// Runs float32 sgemms (torch::mm) of `size`×`size` for about `duration` (at least 5 rounds of
// 100 ms) on `threads` intra-op threads (0: the machine's physical cores, hwloc); returns GFLOPS, the median
// round.
double probeComputeGflops(int size = 1024,
                          std::chrono::milliseconds duration = std::chrono::milliseconds(1500),
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

// {"IP": "<address>", "benchmarks": {"ram": …, "bandwidth": …, "compute": …, "cores": …}}
nlohmann::json nodeConfigEntry(const MachineProbe& probe, const std::string& address);

}  // namespace cairn
