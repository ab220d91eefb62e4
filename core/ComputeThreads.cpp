#include "core/ComputeThreads.h"

#include <ATen/Parallel.h>

#include "core/BlasThreads.h"

namespace cairn {

ScopedComputeThreads::ScopedComputeThreads(int threads)
    : previous_threads_(at::get_num_threads()), previous_blas_threads_(blasThreads()) {
  at::set_num_threads(threads);
  setBlasThreads(1);
}

ScopedComputeThreads::~ScopedComputeThreads() {
  at::set_num_threads(previous_threads_);
  if (previous_blas_threads_ > 0) setBlasThreads(previous_blas_threads_);
}

}  // namespace cairn
