// The volunteer's side of the coordination protocol, driven by a coordinator a test plays
// (VolunteerSessionTest.cpp, VolunteerWorkdirTest.cpp): a ROUTER behind a ZapAuthenticator that
// admits any key, real CurveZMQ sockets on 127.0.0.1; a temporary folder; the volunteer on a thread
// of its own.
#pragma once

#include <gtest/gtest.h>
#include <torch/script.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <random>
#include <string>
#include <thread>

#include "core/NodeData.h"
#include "node/protocol/Coordination.h"
#include "node/transport/CurveSecurity.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/VolunteerSession.h"
#include "tests/common/Eventually.h"

namespace cairn::testing {

using namespace std::chrono_literals;
namespace fs = std::filesystem;


inline constexpr size_t kLimit = 64 << 20;

inline std::optional<ReachOk> reachOnce(zmq::socket_t& dealer, const std::string& nonce,
                                        std::chrono::milliseconds wait) {
  sendFrames(dealer, encode(ReachCheck{nonce}));
  auto frames = recvFrames(dealer, wait);
  if (!frames) return std::nullopt;
  std::string why;
  auto reply = decodeReach(*frames, &why);
  if (!reply || !std::holds_alternative<ReachOk>(*reply)) return std::nullopt;
  return std::get<ReachOk>(*reply);
}

// The coordinator a test plays: a ROUTER behind a ZapAuthenticator that admits any key.
struct PlayedCoordinator {
  CurveKeyPair keys = generateCurveKeyPair();
  zmq::context_t context;
  ZapAuthenticator zap{context, ZapAuthenticator::AnyKey{}};
  std::string bound;
  zmq::socket_t router = coordinationServer(context, keys, "127.0.0.1:0", kLimit, &bound);

  Invite invite() const {
    Invite i;
    const auto colon = bound.rfind(':');
    i.host = bound.substr(0, colon);
    i.port = std::stoi(bound.substr(colon + 1));
    i.coordinator_key = keys.public_key;
    i.token = "00112233445566778899aabbccddeeff";
    return i;
  }
  // The next message, decoded (test failure when none comes within 10 s or it is malformed).
  std::pair<Routed, ToCoordinator> next() {
    auto in = recvRouted(router, 10s);
    if (!in) throw std::runtime_error("the fake coordinator received nothing within 10 s");
    std::string why;
    auto m = decodeToCoordinator(in->frames, kLimit, &why);
    if (!m) throw std::runtime_error("malformed message to the coordinator: " + why);
    return {*in, *m};
  }
  template <typename T>
  std::pair<Routed, T> expect() {
    for (;;) {
      auto [routed, m] = next();
      if (std::holds_alternative<T>(m)) return {routed, std::get<T>(m)};
      if (!std::holds_alternative<Heartbeat>(m))  // heartbeats may come between anything
        throw std::runtime_error("the fake coordinator got an unexpected message");
    }
  }
  void reply(const Routed& to, const Frames& frames) { sendRouted(router, to.routing_id, frames); }
  // bandwidth → bandwidth_ack, then the join (after checking the volunteer answers its
  // reachability check at the advertised address with the key it joined with).
  std::pair<Routed, JoinAsk> acceptProbeAndJoin() {
    auto [probe_from, probe] = expect<BandwidthProbeMsg>();
    reply(probe_from, encode(BandwidthAck{int64_t(probe.payload.size())}));
    auto [join_from, join] = expect<JoinAsk>();
    zmq::socket_t check = coordinationClient(context, zmq::socket_type::dealer, keys,
                                             join_from.user_id, join.advertise, 1 << 16);
    const auto ok = reachOnce(check, "reach-" + join_from.user_id.substr(0, 8), 10s);
    if (!ok || ok->nonce != "reach-" + join_from.user_id.substr(0, 8))
      throw std::runtime_error("the volunteer did not answer the reachability check");
    return {join_from, join};
  }
};

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() / ("cairn_coordination_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(std::random_device{}())))
               .string();
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Tests stop their volunteer through `abandon` when they end early (a failed expectation), so that
// no volunteer thread outlives its test waiting for an assignment that will not come.
inline VolunteerConfig configFor(const PlayedCoordinator& coordinator, const std::string& workdir,
                                 std::atomic<bool>* abandon) {
  VolunteerConfig c;
  c.stop_requested = [abandon] { return abandon->load(); };
  c.invite = coordinator.invite();
  c.listen = "127.0.0.1:0";  // advertise: the bound address
  c.workdir = workdir;
  c.coordinator_timeout = 10s;
  c.heartbeat_interval = 50ms;
  c.probe_megabytes = 1;
  return c;
}

inline const VolunteerProbe kMachine{7.5, 4, 55.5, 0, {}, "1.13.0"};

// Runs `body` on another thread (the volunteer's); join() rethrows what it threw. Destroyed
// without join() (the test failed early), it sets `abandon` first.
class VolunteerThread {
 public:
  VolunteerThread(std::atomic<bool>& abandon, std::function<void()> body)
      : abandon_(abandon), thread_([this, body] {
          try {
            body();
          } catch (...) {
            error_ = std::current_exception();
          }
        }) {}
  ~VolunteerThread() {
    if (!thread_.joinable()) return;
    abandon_ = true;
    thread_.join();
  }
  void join() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool>& abandon_;
  std::exception_ptr error_;
  std::thread thread_;
};

// A one-stage plan for node `name` at `address`, and a real TorchScript stage (forward: 2x).
inline std::string doublingStage() {
  torch::jit::Module m("Doubling");
  m.define("def forward(self, x):\n  return x * 2.0\n");
  std::ostringstream bytes;
  m.save(bytes);
  return bytes.str();
}

inline Assignment goodAssignment(const std::string& name, const std::string& address) {
  NodeSpec node;
  node.name = name;
  node.job_id = "job-7";
  node.address = address;
  node.inputs = {{"x", "tensor", "float32", {1, 4}}};
  node.outputs = {{"y", "tensor", "float32", {1, 4}}};
  JobSpec job;
  job.job_id = "job-7";
  job.data.location = "/nonexistent/data";
  job.data.format = "idx";
  Assignment a;
  a.name = name;
  a.node = toJson(node);
  a.job = toJson(job);
  a.num_clusters = 2;
  a.stage = doublingStage();
  return a;
}

}  // namespace cairn::testing
