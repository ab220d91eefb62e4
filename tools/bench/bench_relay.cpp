// bench_relay: what a relay (node/transport/Relay.h, `provider --relay`) costs its volunteer while
// it holds messages back: the relay in a process of its own (forked first), two dial-out members a
// and b in this one, a sending messages to b over real CurveZMQ on loopback. Two cases, each timed
// from a's first send to b's last receive:
//   paced — `--messages` of `--bytes`, the relay capped at `--mbps` (RelayOptions::max_mbps); b
//           reads as fast as it can.
//   slow  — no cap; b reads one of `--slow-messages` of `--slow-bytes` every `--read-every-ms` (a
//           slow home link: the relay's pipe to b, 4 messages, the sockets' buffers and b's own
//           queue, 1, stay full; the rest waits at the relay).
//   window — `--messages` of `--bytes` between two real dial-out-only ZmqTransports over relayed
//           links (sealed end to end, acknowledged), through the relay capped at `--mbps`: the
//           sender's window of 16 unacknowledged messages fills and its send() waits for room.
// Per case: the wall time, the relay process's CPU (user + system) over that time, its loop's
// turns (RelayStats::loop_turns: its wakeups) and the messages it forwarded; for window, this
// process's CPU and its voluntary context switches (each wait that sleeps is one, in any thread).
// The CPU includes CURVE's encryption of the forwarded bytes, the same in every build; the turns
// and switches are what the waiting costs.
//   build/tools/bench/bench_relay   (the defaults: 40 × 100 kB at 8 Mbit/s; 200 × 256 KiB, a read each 10 ms)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <zmq_addon.hpp>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/MainGuard.h"
#include "node/transport/Relay.h"
#include "node/transport/RelayedLinks.h"
#include "node/transport/ZmqTransport.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_relay.
namespace cairn::bench::relay {

using namespace std::chrono;

namespace {

struct Figures {  // the relay process's, over one case
  double cpu_s = 0;
  uint64_t turns = 0, forwarded = 0;
};

double cpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return s(usage.ru_utime) + s(usage.ru_stime);
}

void writeAll(int fd, const void* data, size_t n) {
  if (write(fd, data, n) != static_cast<ssize_t>(n)) CAIRN_THROW(InternalError, "bench_relay: pipe write");
}
void readAll(int fd, void* data, size_t n) {
  if (read(fd, data, n) != static_cast<ssize_t>(n)) CAIRN_THROW(InternalError, "bench_relay: pipe read");
}

// The relay's process: binds, says where, then per command byte from the parent: 's' notes its CPU
// and counters, 'e' writes the difference since 's' back, 'q' ends it.
[[noreturn]] void relayProcess(RelayOptions options, const CurveKeyPair& a, const CurveKeyPair& b,
                               int commands, int answers) {
  options.bind_endpoint = "tcp://127.0.0.1:*";
  Relay relay(options);
  relay.setLinks({{"a", a.public_key}, {"b", b.public_key}}, {{"a", "b"}});
  const std::string endpoint = relay.boundEndpoint();
  const uint32_t length = static_cast<uint32_t>(endpoint.size());
  writeAll(answers, &length, sizeof length);
  writeAll(answers, endpoint.data(), length);
  Figures start;
  for (char command = 0; read(commands, &command, 1) == 1 && command != 'q';) {
    const RelayStats stats = relay.stats();
    Figures now{cpuSeconds(), stats.loop_turns, stats.messages_forwarded};
    if (command == 's') start = now;
    if (command != 'e') continue;
    Figures delta{now.cpu_s - start.cpu_s, now.turns - start.turns, now.forwarded - start.forwarded};
    writeAll(answers, &delta, sizeof delta);
  }
  std::_Exit(0);  // no atexit handlers of the parent's copy
}

class Member {  // a dial-out volunteer's DEALER to the relay (the wire of Relay.h)
 public:
  Member(const std::string& name, const CurveKeyPair& keys, const std::string& relay_key,
         const std::string& endpoint, int receive_high_water_mark)
      : dealer_(context_, zmq::socket_type::dealer) {
    dealer_.set(zmq::sockopt::rcvhwm, receive_high_water_mark);
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.set(zmq::sockopt::curve_serverkey, relay_key);
    dealer_.set(zmq::sockopt::curve_publickey, keys.public_key);
    dealer_.set(zmq::sockopt::curve_secretkey, keys.secret_key);
    dealer_.connect(endpoint);
    const auto deadline = steady_clock::now() + 15s;
    for (;;) {  // attach until the relay answers with a presence
      send({"A", name});
      auto answer = next(500ms);
      if (answer.size() > 0 && answer[0].to_string() == "P") return;
      if (steady_clock::now() > deadline) CAIRN_THROW(InternalError, "bench_relay: ", name, " never attached");
    }
  }
  void send(const std::vector<std::string>& frames) {
    std::vector<zmq::message_t> out;
    for (const auto& frame : frames) out.emplace_back(frame.data(), frame.size());
    if (!zmq::send_multipart(dealer_, out)) CAIRN_THROW(InternalError, "bench_relay: send failed");
  }
  std::vector<zmq::message_t> next(milliseconds limit) {
    zmq::pollitem_t item{static_cast<void*>(dealer_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, limit);
    std::vector<zmq::message_t> in;
    (void)zmq::recv_multipart(dealer_, std::back_inserter(in), zmq::recv_flags::dontwait);
    return in;
  }

 private:
  zmq::context_t context_;
  zmq::socket_t dealer_;
};

// The relay in a forked process of its own, for members a and b (keys drawn here), and the pipes
// to it: start() and finish() bracket what is measured.
class RelayChild {
 public:
  explicit RelayChild(RelayOptions options) {
    if (pipe(commands_) != 0 || pipe(answers_) != 0) CAIRN_THROW(InternalError, "bench_relay: pipe");
    options.own = relay_keys;
    std::fflush(stdout);  // nothing buffered is written twice
    child_ = fork();
    if (child_ == 0) {
      close(commands_[1]);  // the parent's end: its exit ends the child's read
      close(answers_[0]);
      relayProcess(options, a_keys, b_keys, commands_[0], answers_[1]);
    }
    close(commands_[0]);
    close(answers_[1]);
    uint32_t length = 0;
    readAll(answers_[0], &length, sizeof length);
    endpoint.assign(length, '\0');
    readAll(answers_[0], endpoint.data(), length);
  }
  ~RelayChild() {
    writeAll(commands_[1], "q", 1);
    waitpid(child_, nullptr, 0);
    close(commands_[1]);
    close(answers_[0]);
  }
  void start() { writeAll(commands_[1], "s", 1); }
  Figures finish() {
    writeAll(commands_[1], "e", 1);
    Figures figures;
    readAll(answers_[0], &figures, sizeof figures);
    return figures;
  }

  const CurveKeyPair relay_keys = generateCurveKeyPair(), a_keys = generateCurveKeyPair(),
                     b_keys = generateCurveKeyPair();
  std::string endpoint;

 private:
  int commands_[2] = {-1, -1}, answers_[2] = {-1, -1};
  pid_t child_ = -1;
};

void printFigures(const char* name, double wall, const Figures& figures) {
  std::printf("%-6s %8.2f s wall  relay CPU %6.3f s (%5.1f %% of a core)  loop turns %7llu (%6.0f /s)  "
              "forwarded %llu",
              name, wall, figures.cpu_s, 100 * figures.cpu_s / wall,
              static_cast<unsigned long long>(figures.turns), double(figures.turns) / wall,
              static_cast<unsigned long long>(figures.forwarded));
}

// One case: the relay forked with `options`, a sends, b reads (pausing `read_every` before each).
void runCase(const char* name, const RelayOptions& options, int messages, size_t bytes,
             milliseconds read_every) {
  RelayChild relay(options);
  Member a("a", relay.a_keys, relay.relay_keys.public_key, relay.endpoint, 1000);
  Member b("b", relay.b_keys, relay.relay_keys.public_key, relay.endpoint, 1);
  const std::string payload(bytes, 'x');
  relay.start();
  const auto start = steady_clock::now();
  for (int i = 0; i < messages; ++i) a.send({"D", "b", payload});
  for (int got = 0; got < messages;) {
    if (read_every.count() > 0) std::this_thread::sleep_for(read_every);
    auto in = b.next(30s);
    if (in.empty()) CAIRN_THROW(InternalError, "bench_relay: ", name, ": message ", got, " never came");
    if (in[0].to_string() == "D") ++got;
  }
  const double wall = duration<double>(steady_clock::now() - start).count();
  printFigures(name, wall, relay.finish());
  std::printf("\n");
}

struct Usage {  // this process's, all its threads
  double cpu_s = 0;
  long switches = 0;  // voluntary context switches
};
Usage usageNow() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return {cpuSeconds(), usage.ru_nvcsw};
}

// The window case: a and b are ZmqTransports whose links go through the relay (forked, capped).
void runWindowCase(double mbps, int messages, size_t bytes) {
  RelayOptions options;
  options.max_mbps = mbps;
  RelayChild relay(options);
  auto node = [&](const std::string& name, const CurveKeyPair& own, const std::string& peer,
                  const CurveKeyPair& peer_keys, zmq::context_t& context) {
    TransportOptions o;
    o.curve = CurveOptions{own, {{peer, peer_keys.public_key}}};
    o.dial_out_only = true;
    auto t = std::make_unique<ZmqTransport>(context, name, "", o);
    t->addPeer(peer, relayedEndpoint(relay.relay_keys.public_key, relay.endpoint));
    return t;
  };
  zmq::context_t a_context, b_context;
  auto a = node("a", relay.a_keys, "b", relay.b_keys, a_context);
  auto b = node("b", relay.b_keys, "a", relay.a_keys, b_context);
  Message message;
  message.kind = MessageKind::kControl;
  message.sender = "a";
  message.tensors.push_back({"x", torch::ones({static_cast<int64_t>(bytes / 4)})});  // --bytes
  relay.start();
  const Usage before = usageNow();
  const auto start = steady_clock::now();
  int received = 0;
  std::thread receiver([&] {  // gives up after a minute without a message (joined below)
    while (received < messages && b->receive(60s)) ++received;
  });
  int sent = 0;
  while (sent < messages) {
    message.tag = std::to_string(sent);
    if (a->send("b", message, 60s) != SendStatus::kSent) break;
    ++sent;
  }
  receiver.join();
  if (sent < messages || received < messages)
    CAIRN_THROW(InternalError, "bench_relay: window: ", sent, " of ", messages, " sent, ", received,
                " received");
  const double wall = duration<double>(steady_clock::now() - start).count();
  const Usage after = usageNow();
  printFigures("window", wall, relay.finish());
  const long switches = after.switches - before.switches;
  std::printf(";  members' CPU %6.3f s, voluntary switches %ld (%.0f /s)\n", after.cpu_s - before.cpu_s,
              switches, double(switches) / wall);
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"bench_relay: a relay's CPU while the cap or a slow destination holds messages back"};
  int messages = 40, slow_messages = 200, read_every_ms = 10;
  size_t bytes = 100000, slow_bytes = 256 << 10;
  double mbps = 8;
  app.add_option("--messages", messages, "paced: messages a sends to b")->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--bytes", bytes, "paced: bytes of each")->check(CLI::Range(size_t{1}, size_t{64} << 20))
      ->capture_default_str();
  app.add_option("--mbps", mbps, "paced: the relay's cap (Mbit/s)")->check(CLI::Range(0.01, 1e6))
      ->capture_default_str();
  app.add_option("--slow-messages", slow_messages, "slow: messages a sends to b")
      ->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--slow-bytes", slow_bytes, "slow: bytes of each")
      ->check(CLI::Range(size_t{1}, size_t{64} << 20))->capture_default_str();
  app.add_option("--read-every-ms", read_every_ms, "slow: b's pause before each read")
      ->check(CLI::Range(1, 10000))->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("bench_relay", [&] {
    RelayOptions paced;
    paced.max_mbps = mbps;
    runCase("paced", paced, messages, bytes, 0ms);
    RelayOptions slow;
    slow.send_high_water_mark = 4;
    runCase("slow", slow, slow_messages, slow_bytes, milliseconds(read_every_ms));
    runWindowCase(mbps, messages, bytes);
    return 0;
  });
}

}  // namespace cairn::bench::relay
