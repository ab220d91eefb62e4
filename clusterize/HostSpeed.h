// HostSpeed: this machine's float32 throughput, the yardstick that turns profiled seconds into
// seconds on a GPU node (PlannerNodes.h). The same benchmark as `provider --probe`'s compute
// figure (node/volunteer/Probe.cpp probeComputeGflops, which clusterize may not include): sgemms
// of size x size through torch::mm_out, rounds of 100 ms for about `duration` (at least 5), the
// median round. It runs with `threads` intra-op threads: the count the atoms were profiled with
// (training_definition.threads), so seconds x host GFLOPS is the work a profiled atom did.
// Not thread-safe (sets torch's intra-op thread count for its duration).
#pragma once

#include <chrono>

namespace cairn::clusterize {

double measureHostGflops(int threads, int size = 1024,
                         std::chrono::milliseconds duration = std::chrono::milliseconds(1500));

}  // namespace cairn::clusterize
