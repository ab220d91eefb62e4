// bench_transport: throughput of one tensor sent between two processes through cairn's codec and
// ZeroMQ transport. The parent sends `--repeat` messages of `--size-mb` MiB, the child receives
// them and answers with one acknowledgement; the figure is bytes / (first send → ack), median of
// `--rounds` rounds after one warm-up round.
//   build/tools/bench/bench_transport --size-mb 64 --repeat 8 --rounds 5 --transport tcp
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "core/Error.h"
#include "core/MainGuard.h"
#include "node/ZmqTransport.h"

using namespace std::chrono;

int main(int argc, char** argv) {
  CLI::App app{"bench_transport: tensor throughput between two processes over cairn's transport"};
  double size_mb = 64;
  int repeat = 8, rounds = 5, port = 5590;
  std::string kind = "tcp";
  app.add_option("--size-mb", size_mb, "tensor size in MiB")->capture_default_str();
  app.add_option("--repeat", repeat, "messages per round")->capture_default_str();
  app.add_option("--rounds", rounds, "timed rounds (median reported)")->capture_default_str();
  app.add_option("--transport", kind, "tcp or ipc")->check(CLI::IsMember({"tcp", "ipc"}))
      ->capture_default_str();
  app.add_option("--port", port, "first of two loopback ports (tcp)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto endpoint = [&](int which) {
    if (kind == "tcp") return "tcp://127.0.0.1:" + std::to_string(port + which);
    return "ipc:///tmp/cairn-bench-" + std::to_string(::getpid()) + "-" + std::to_string(which);
  };
  const std::string sender_ep = endpoint(0), receiver_ep = endpoint(1);
  const int64_t elements = static_cast<int64_t>(size_mb * 1024 * 1024 / 4);
  const pid_t child = ::fork();
  if (child == 0) {
    return cairn::runGuarded("bench_transport(receiver)", [&] {
      zmq::context_t context;
      cairn::ZmqTransport t(context, "receiver", receiver_ep);
      t.addPeer("sender", sender_ep);
      for (int r = 0; r < rounds + 1; ++r) {
        for (int i = 0; i < repeat; ++i) {
          auto m = t.receive(seconds(60));
          if (!m) CAIRN_THROW(PeerLost, "no message from the sender within 60 s");
        }
        cairn::Message ack;
        ack.kind = cairn::MessageKind::kControl;
        ack.text = "ack";
        if (t.send("sender", ack, seconds(60)) != cairn::SendStatus::kSent)
          CAIRN_THROW(PeerLost, "could not acknowledge");
      }
      t.flushAndClose(seconds(5));
      return 0;
    });
  }
  const int rc = cairn::runGuarded("bench_transport", [&] {
    zmq::context_t context;
    cairn::ZmqTransport t(context, "sender", sender_ep);
    t.addPeer("receiver", receiver_ep);
    cairn::Message m;
    m.kind = cairn::MessageKind::kActivation;
    m.tensors.push_back({"x", torch::rand({elements})});
    std::vector<double> seconds_per_round;
    for (int r = 0; r < rounds + 1; ++r) {
      const auto start = steady_clock::now();
      for (int i = 0; i < repeat; ++i)
        if (t.send("receiver", m, seconds(60)) != cairn::SendStatus::kSent)
          CAIRN_THROW(PeerLost, "receiver did not take a message within 60 s");
      if (!t.receive(seconds(120))) CAIRN_THROW(PeerLost, "no acknowledgement within 120 s");
      if (r > 0) seconds_per_round.push_back(duration<double>(steady_clock::now() - start).count());
    }
    std::sort(seconds_per_round.begin(), seconds_per_round.end());
    const double median = seconds_per_round[seconds_per_round.size() / 2];
    const double bytes = double(elements) * 4 * repeat;
    std::printf("transport=%s size=%.0fMiB repeat=%d rounds=%d median=%.4fs throughput=%.3f GB/s\n",
                kind.c_str(), size_mb, repeat, rounds, median, bytes / median / 1e9);
    return 0;
  });
  int status = 0;
  ::waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
