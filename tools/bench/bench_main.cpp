// cairn_bench: every C++ benchmark in one executable, chosen by the name it is run as (a multi-call
// binary, as busybox): the build links build/tools/bench/bench_transport, bench_allreduce, ... to
// it, so each keeps its own path and flags. `cairn_bench NAME [flags]` runs one by name too.
// One executable compiles CLI11 and loads the torch headers once instead of seven times (~100 s of
// a 2-core build). The benchmarks that start copies of themselves (bench_allreduce, bench_rings:
// tools/bench/BenchProcesses.h) exec /proc/self/exe with their argv, whose first word keeps the name.
#include <cstdio>
#include <cstring>
#include <string>

#include "tools/bench/BenchMains.h"

namespace {

struct Bench {
  const char* name;
  int (*run)(int, char**);
};

constexpr Bench kBenches[] = {
    {"bench_transport", cairn::bench::transport::run},
    {"bench_planning", cairn::bench::planning::run},
    {"bench_single_process", cairn::bench::single_process::run},
    {"bench_allreduce", cairn::bench::allreduce::run},
    {"bench_rings", cairn::bench::rings::run},
    {"bench_precision", cairn::bench::precision::run},
    {"bench_metrics_stream", cairn::bench::metrics_stream::run},
    {"bench_relay", cairn::bench::relay::run},
};

}  // namespace

int main(int argc, char** argv) {
  const char* slash = argc > 0 ? std::strrchr(argv[0], '/') : nullptr;
  std::string name = argc > 0 ? (slash ? slash + 1 : argv[0]) : "";
  if (name == "cairn_bench" && argc > 1) {  // cairn_bench NAME [flags]: NAME takes argv[0]'s place
    name = argv[1];
    --argc;
    ++argv;
  }
  for (const Bench& b : kBenches)
    if (name == b.name) return b.run(argc, argv);
  std::fprintf(stderr, "cairn_bench: run as one of the benchmarks, or as `cairn_bench NAME [flags]`; "
                       "'%s' is none of:", name.c_str());
  for (const Bench& b : kBenches) std::fprintf(stderr, " %s", b.name);
  std::fprintf(stderr, "\n");
  return 2;
}
