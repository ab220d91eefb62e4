#pragma once
// The BLAS behind Debian's libtorch: libblas.so.3, which tools/setup.sh makes Debian's OpenBLAS
// (libopenblas0-pthread; the reference BLAS a bare Debian 12 has is ~13x slower per matmul).
//
// OpenBLAS splits a matmul over its own threads, and how many it uses changes the result's last
// bits (measured: 1 vs 2 threads give different sgemm results here). So a process that must
// reproduce another bit for bit (a resumed run, a pipeline against one PyTorch process) runs
// every BLAS call on one thread: cairn's parallelism is its stages and torch's intra-op threads,
// not BLAS's. Several providers on one machine then never spin BLAS thread pools against each
// other either.
namespace cairn {

// Sets OpenBLAS's thread count for this process (openblas_set_num_threads, found at run time:
// nothing happens with another BLAS). Returns whether an OpenBLAS was found.
bool setBlasThreads(int threads);

// OpenBLAS's thread count for this process (openblas_get_num_threads), or -1 with another BLAS.
int blasThreads();

}  // namespace cairn
