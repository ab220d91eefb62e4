// bench_transport: one tensor sent between two processes, for a list of sizes, three ways in the
// same run, alternating round by round so machine noise hits all of them alike:
//   cairn   — cairn's codec + ZmqTransport (msgpack header frame + zero-copy tensor frame)
//   raw     — a bare ZeroMQ PUSH/PULL pair sending the same bytes as one zero-copy frame
//   memcpy  — a single-process memcpy of the same size (the ceiling of this machine's memory)
// The parent sends `repeat` messages per round, the child receives them and answers one ack; a
// round's time runs from the first send to the ack. Medians over `--rounds` after one warm-up.
//   build/tools/bench/bench_transport --sizes 64M --rounds 5 --transport tcp
//   build/tools/bench/bench_transport --sizes 4K,64K,1M,16M,64M,256M --json   (tools/bench/run_all)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <CLI/CLI.hpp>
#include <zmq_addon.hpp>

#include "core/Error.h"
#include "core/MainGuard.h"
#include "node/transport/ZmqTransport.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_transport.
namespace cairn::bench::transport {

using namespace std::chrono;

namespace {

size_t parseSize(const std::string& text) {
  size_t pos = 0;
  const double value = std::stod(text, &pos);
  const std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "KB" || unit == "KiB") scale = 1024;
  else if (unit == "M" || unit == "MB" || unit == "MiB") scale = 1024 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!unit.empty()) CAIRN_THROW(BadInput, "--sizes: unknown unit \"", unit, "\" (use K, M or G)");
  return static_cast<size_t>(value * scale);
}

// Enough messages per round that a round moves at least 256 MiB (bounded for tiny sizes).
int repeatFor(size_t bytes) {
  return static_cast<int>(std::clamp<size_t>((size_t{256} << 20) / std::max<size_t>(bytes, 1), 1, 2000));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void noFree(void*, void*) {}

const char* kModes[] = {"cairn", "raw"};

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"bench_transport: tensor throughput between two processes (cairn vs raw ZeroMQ vs memcpy)"};
  std::string sizes_text = "64M";
  int rounds = 5, port = 5590;
  std::string kind = "tcp";
  bool json = false;
  app.add_option("--sizes", sizes_text, "comma-separated sizes, e.g. 4K,1M,64M")->capture_default_str();
  app.add_option("--rounds", rounds, "timed rounds per size and way (median reported)")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--transport", kind, "tcp or ipc")->check(CLI::IsMember({"tcp", "ipc"}))
      ->capture_default_str();
  app.add_option("--port", port, "first of four loopback ports (tcp)")->capture_default_str();
  app.add_flag("--json", json, "one JSON object per line instead of a table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::vector<size_t> sizes;
  const int parsed = cairn::runGuarded("bench_transport", [&] {
    std::stringstream in(sizes_text);
    for (std::string item; std::getline(in, item, ',');) sizes.push_back(parseSize(item));
    if (sizes.empty()) CAIRN_THROW(BadInput, "--sizes: no sizes given");
    return 0;
  });
  if (parsed != 0) return parsed;

  const std::string tag = std::to_string(::getpid());
  auto endpoint = [&](int which) {
    if (kind == "tcp") return "tcp://127.0.0.1:" + std::to_string(port + which);
    return "ipc:///tmp/cairn-bench-" + tag + "-" + std::to_string(which);
  };
  // 0: parent's cairn inbound (acks), 1: child's cairn inbound, 2: child's raw PULL.
  const pid_t child = ::fork();
  if (child == 0) {
    return cairn::runGuarded("bench_transport(receiver)", [&] {
      zmq::context_t context;
      cairn::ZmqTransport t(context, "receiver", endpoint(1));
      t.addPeer("sender", endpoint(0));
      zmq::socket_t raw(context, zmq::socket_type::pull);
      raw.set(zmq::sockopt::rcvhwm, 16);
      raw.bind(endpoint(2));
      cairn::Message ack;
      ack.kind = cairn::MessageKind::kControl;
      for (size_t bytes : sizes) {
        const int repeat = repeatFor(bytes);
        for (int r = 0; r < rounds + 1; ++r) {
          for (const char* mode : kModes) {
            for (int i = 0; i < repeat; ++i) {
              if (std::strcmp(mode, "cairn") == 0) {
                if (!t.receive(seconds(60))) CAIRN_THROW(PeerLost, "no message from the sender in 60 s");
              } else {
                zmq::message_t m;
                raw.set(zmq::sockopt::rcvtimeo, 60000);
                if (!raw.recv(m)) CAIRN_THROW(PeerLost, "no raw frame from the sender in 60 s");
              }
            }
            if (t.send("sender", ack, seconds(60)) != cairn::SendStatus::kSent)
              CAIRN_THROW(PeerLost, "could not acknowledge");
          }
        }
      }
      t.flushAndClose(seconds(5));
      return 0;
    });
  }
  const int rc = cairn::runGuarded("bench_transport", [&] {
    zmq::context_t context;
    cairn::ZmqTransport t(context, "sender", endpoint(0));
    t.addPeer("receiver", endpoint(1));
    zmq::socket_t raw(context, zmq::socket_type::push);
    raw.set(zmq::sockopt::sndhwm, 16);
    raw.set(zmq::sockopt::linger, 0);
    raw.connect(endpoint(2));
    if (!json)
      std::printf("%-10s %8s %14s %14s %14s %12s\n", "size", "repeat", "cairn GB/s", "raw zmq GB/s",
                  "memcpy GB/s", "cairn/raw");
    for (size_t bytes : sizes) {
      const int repeat = repeatFor(bytes);
      const int64_t elements = static_cast<int64_t>(bytes / 4);
      cairn::Message m;
      m.kind = cairn::MessageKind::kActivation;
      m.tensors.push_back({"x", torch::rand({elements})});
      const size_t payload = m.tensors[0].tensor.nbytes();
      std::vector<double> seconds_of[2], memcpy_seconds;
      std::vector<char> destination(payload + 1);
      for (int r = 0; r < rounds + 1; ++r) {
        for (int mode = 0; mode < 2; ++mode) {
          const auto start = steady_clock::now();
          for (int i = 0; i < repeat; ++i) {
            if (mode == 0) {
              if (t.send("receiver", m, seconds(60)) != cairn::SendStatus::kSent)
                CAIRN_THROW(PeerLost, "receiver did not take a message within 60 s");
            } else {
              zmq::message_t frame(m.tensors[0].tensor.data_ptr(), payload, &noFree, nullptr);
              raw.set(zmq::sockopt::sndtimeo, 60000);
              if (!raw.send(frame, zmq::send_flags::none)) CAIRN_THROW(PeerLost, "raw send timed out");
            }
          }
          if (!t.receive(seconds(120))) CAIRN_THROW(PeerLost, "no acknowledgement within 120 s");
          if (r > 0) seconds_of[mode].push_back(duration<double>(steady_clock::now() - start).count());
        }
        const auto start = steady_clock::now();
        for (int i = 0; i < repeat; ++i) {
          std::memcpy(destination.data(), m.tensors[0].tensor.data_ptr(), payload);
          asm volatile("" : : "r"(destination.data()) : "memory");  // keep the copy
        }
        if (r > 0) memcpy_seconds.push_back(duration<double>(steady_clock::now() - start).count());
      }
      const double total = double(payload) * repeat;
      const double cairn_gbs = total / median(seconds_of[0]) / 1e9;
      const double raw_gbs = total / median(seconds_of[1]) / 1e9;
      const double memcpy_gbs = total / median(memcpy_seconds) / 1e9;
      if (json) {
        std::printf("{\"transport\":\"%s\",\"bytes\":%zu,\"repeat\":%d,\"rounds\":%d,"
                    "\"cairn_gbps\":%.4f,\"raw_gbps\":%.4f,\"memcpy_gbps\":%.4f}\n",
                    kind.c_str(), payload, repeat, rounds, cairn_gbs, raw_gbs, memcpy_gbs);
      } else {
        std::printf("%-10zu %8d %14.3f %14.3f %14.3f %12.2f\n", payload, repeat, cairn_gbs,
                    raw_gbs, memcpy_gbs, cairn_gbs / raw_gbs);
      }
      std::fflush(stdout);
    }
    return 0;
  });
  int status = 0;
  ::waitpid(child, &status, 0);
  // ipc endpoints are files that outlive their sockets: remove this run's three.
  if (kind == "ipc")
    for (int which = 0; which < 3; ++which) ::unlink(endpoint(which).substr(6).c_str());
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace cairn::bench::transport
