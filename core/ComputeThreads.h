// ScopedComputeThreads: for its lifetime, torch's intra-op thread count is `threads` and BLAS
// runs on one thread (core/BlasThreads.h), as in a provider (node/pipeline/ProviderRun.cpp); both
// are restored after. For the code that measures what a provider will get: clusterize's profile
// of the atoms and the sgemm yardstick (core/MatmulSpeed.h). Not thread-safe (both settings are
// the process's).
#pragma once

namespace cairn {

class ScopedComputeThreads {
 public:
  explicit ScopedComputeThreads(int threads);
  ~ScopedComputeThreads();
  ScopedComputeThreads(const ScopedComputeThreads&) = delete;
  ScopedComputeThreads& operator=(const ScopedComputeThreads&) = delete;

 private:
  int previous_threads_;
  int previous_blas_threads_;  // -1: no OpenBLAS behind libtorch
};

}  // namespace cairn
