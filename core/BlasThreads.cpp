#include "core/BlasThreads.h"

#include <dlfcn.h>

namespace cairn {

bool setBlasThreads(int threads) {
  // Looked up rather than linked: libblas.so.3 is whichever BLAS Debian's alternatives chose, and
  // only OpenBLAS has this symbol (libtorch already loaded the library; RTLD_DEFAULT finds it).
  using SetThreads = void (*)(int);
  auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set == nullptr) return false;
  set(threads);
  return true;
}

int blasThreads() {
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get == nullptr ? -1 : get();
}

}  // namespace cairn
