// The C++ benchmarks, one `run` each, all in one executable (cairn_bench, tools/bench/bench_main.cpp):
// CLI11 and the torch headers are compiled once for all of them instead of once per benchmark.
#pragma once

namespace cairn::bench {
namespace transport { int run(int argc, char** argv); }
namespace planning { int run(int argc, char** argv); }
namespace single_process { int run(int argc, char** argv); }
namespace allreduce { int run(int argc, char** argv); }
namespace rings { int run(int argc, char** argv); }
namespace precision { int run(int argc, char** argv); }
namespace metrics_stream { int run(int argc, char** argv); }
namespace relay { int run(int argc, char** argv); }
}  // namespace cairn::bench
