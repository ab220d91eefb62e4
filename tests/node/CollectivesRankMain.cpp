// collectives_rank: one rank of a collectives test run as its own process over tcp://127.0.0.1
// (tests/node/CollectivesOverProcessesTest.cpp starts several). Ranks are named rank0, rank1, …
//   --mode check: run checkAllCollectives, print failures, exit 0 when there are none (1 else).
//   --mode loop:  all-reduce a tensor over and over until a peer is lost (exit 3, the PeerLost
//                 line on stderr) — the kill-a-rank test SIGKILLs one rank meanwhile.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include "core/Error.h"
#include "core/MainGuard.h"
#include "node/transport/ZmqTransport.h"
#include "tests/node/CollectiveChecks.h"

int main(int argc, char** argv) {
  CLI::App app{"collectives_rank: one rank of a multi-process collectives test"};
  int rank = 0;
  std::string ports_text, dtype_name = "float32", mode = "check";
  int64_t numel = 1000;
  int timeout_ms = 10000;
  app.add_option("--rank", rank)->required();
  app.add_option("--ports", ports_text, "comma-separated loopback ports, one per rank")->required();
  app.add_option("--dtype", dtype_name);
  app.add_option("--numel", numel);
  app.add_option("--timeout-ms", timeout_ms);
  app.add_option("--mode", mode)->check(CLI::IsMember({"check", "loop"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("collectives_rank", [&] {
    std::vector<std::string> ports;
    std::stringstream in(ports_text);
    for (std::string p; std::getline(in, p, ',');) ports.push_back(p);
    const int n = static_cast<int>(ports.size());
    if (rank < 0 || rank >= n) CAIRN_THROW(BadInput, "--rank outside the --ports list");
    const auto dtype = cairn::scalarTypeForName(dtype_name);
    if (!dtype) CAIRN_THROW(BadInput, "unknown --dtype ", dtype_name);
    at::set_num_threads(1);

    std::vector<std::string> names;
    for (int r = 0; r < n; ++r) names.push_back("rank" + std::to_string(r));
    zmq::context_t context(2);  // as a real node: reads and writes on separate I/O threads
    cairn::ZmqTransport transport(context, names[rank], "tcp://127.0.0.1:" + ports[rank]);
    for (int r = 0; r < n; ++r)
      if (r != rank) transport.addPeer(names[r], "tcp://127.0.0.1:" + ports[r]);
    cairn::Mailbox mailbox(transport);
    cairn::ProcessGroupOptions options;
    options.timeout = std::chrono::milliseconds(timeout_ms);
    options.segment_bytes = 64 * 1024;
    cairn::ProcessGroup group(mailbox, "test", names, names[rank], options);

    if (mode == "loop") {
      torch::Tensor t = torch::ones({100000});
      {
        // Every rank is up before the short --timeout-ms applies: on a loaded machine a rank's
        // start (libtorch, the sockets) can take longer than that, which is not what is tested.
        cairn::ProcessGroupOptions start_options = options;
        start_options.timeout = std::chrono::milliseconds(std::max(timeout_ms, 60000));
        cairn::ProcessGroup start(mailbox, "start", names, names[rank], start_options);
        start.allReduce(t, cairn::ReduceOp::kAverage);
      }
      group.allReduce(t, cairn::ReduceOp::kAverage);
      std::fprintf(stderr, "looping\n");
      std::fflush(stderr);
      for (;;) group.allReduce(t, cairn::ReduceOp::kAverage);
    }
    const auto result = cairn::testing::checkAllCollectives(group, *dtype, numel);
    for (const auto& f : result.failures) std::fprintf(stderr, "%s: %s\n", names[rank].c_str(), f.c_str());
    transport.flushAndClose(std::chrono::seconds(5));
    return result.failures.empty() ? 0 : 1;
  });
}
