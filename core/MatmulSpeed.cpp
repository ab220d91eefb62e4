#include "core/MatmulSpeed.h"

#include <torch/script.h>

#include <algorithm>
#include <vector>

#include "core/ComputeThreads.h"
#include "core/Error.h"

namespace cairn {

double measureMatmulGflops(int threads, int size, std::chrono::milliseconds duration) {
  CAIRN_ENFORCE(threads >= 1 && size >= 1, "measureMatmulGflops needs threads and size >= 1");
  ScopedComputeThreads scoped(threads);  // the threads a provider computes with
  c10::InferenceMode inference;
  const auto a = torch::randn({size, size}), b = torch::randn({size, size});
  auto c = torch::mm(a, b);  // warm-up: thread pool, caches
  torch::mm_out(c, a, b);
  const double flops_per_matmul = 2.0 * size * size * size;
  std::vector<double> rates;
  using Clock = std::chrono::steady_clock;
  const auto round = std::min<Clock::duration>(std::chrono::milliseconds(100), duration / 5);
  const auto end = Clock::now() + duration;
  while (Clock::now() < end || rates.size() < 5) {
    const auto start = Clock::now();
    int n = 0;
    do {
      torch::mm_out(c, a, b);
      ++n;
    } while (Clock::now() - start < round);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    rates.push_back(flops_per_matmul * n / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace cairn
