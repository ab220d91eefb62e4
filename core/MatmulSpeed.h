// MatmulSpeed: this machine's float32 throughput in GFLOPS, one benchmark for its two users:
// `provider --probe`'s compute figure (node/volunteer/Probe.cpp probeComputeGflops) and
// clusterize's yardstick that turns profiled seconds into seconds on a GPU node
// (clusterize/PlannerNodes.h, measured with the thread count the atoms were profiled with). Sgemms
// of size x size through torch::mm_out (512² matmuls through torch::matmul spent a large share in
// dispatch and reported a third of it), rounds of 100 ms (duration / 5 when that is shorter: the
// test suite's quick probe) for about `duration`, at least 5 rounds of at least one sgemm, the
// median round, on `threads` intra-op threads and one BLAS thread, as a provider computes
// (core/ComputeThreads.h). Not thread-safe (sets both for its duration, restored after).
#pragma once

#include <chrono>

namespace cairn {

double measureMatmulGflops(int threads, int size = 1024,
                           std::chrono::milliseconds duration = std::chrono::milliseconds(1500));

}  // namespace cairn
