// The coordinator tests' harness (CoordinatorTest.cpp, LiveCoordinatorTest.cpp): a fresh folder, a
// good join, and a live coordinator on a kernel port in a thread with the volunteers that talk to
// it over real CurveZMQ sockets on 127.0.0.1: a client DEALER, the dial-back responder, a member.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "coordinator/Coordinator.h"
#include "core/CurveKeys.h"
#include "node/transport/CurveSecurity.h"
#include "node/volunteer/CoordinationSocket.h"
#include "tests/common/LoopbackPorts.h"
#include "tests/common/ScratchDir.h"

namespace cairn::coordinator::testing {

using std::chrono::milliseconds;

// A fresh folder for one test, removed when it passes (tests/common/ScratchDir.h).
inline std::string freshDir(const std::string& name) {
  return ::cairn::testing::scratchDir("coord_" + name);
}

inline const std::string kToken = "0123456789abcdef0123456789abcdef";

inline JoinAsk goodAsk(const std::string& advertise) {
  JoinAsk a;
  a.token = kToken;
  a.advertise = advertise;
  a.probe = {8.0, 4, 50.0, 1000.0, {}, "1.13.0"};
  return a;
}

// A coordinator on a kernel port in a thread; stopped and joined at the end of the test.
class LiveCoordinator {
 public:
  // The reach timeout is the production default: a good join's dial-back must never miss it on a
  // loaded machine (an unreachable address is admitted dial-out only after it, a few seconds each).
  explicit LiveCoordinator(const std::string& out, milliseconds reach_timeout = milliseconds(5000),
                           const FloodLimits& flood = {},
                           const std::function<void(CoordinatorOptions&)>& configure = {}) {
    CoordinatorOptions o;
    o.flood = flood;
    o.listen = "127.0.0.1:0";
    o.out = out;
    o.min_volunteers = 1000;  // never plans: these tests are about joining
    o.token = kToken;
    o.reach_timeout = reach_timeout;
    o.max_attachment_bytes = 1 << 20;
    o.stop_requested = [this] { return stop_.load(); };
    if (configure) configure(o);
    coordinator_ = std::make_unique<Coordinator>(o, clusterize::PreparedModel{});
    invite_ = parseInvite(coordinator_->invite());
    thread_ = std::thread([this] { coordinator_->run(); });
  }
  ~LiveCoordinator() { stop(); }
  const CoordinatorStats& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return coordinator_->stats();
  }
  const Invite& invite() const { return invite_; }

 private:
  std::atomic<bool> stop_{false};
  std::unique_ptr<Coordinator> coordinator_;
  Invite invite_;
  std::thread thread_;
};

// A volunteer's DEALER to the coordinator; `server_key` defaults to the invite's.
struct Client {
  Client(zmq::context_t& ctx, const Invite& invite, const std::string& server_key = "")
      : keys(generateCurveKeyPair()),
        socket(coordinationClient(ctx, zmq::socket_type::dealer, keys,
                                  server_key.empty() ? invite.coordinator_key : server_key,
                                  invite.address(), 4 << 20)) {}
  std::optional<ToVolunteer> ask(const Frames& frames, milliseconds timeout = milliseconds(10000)) {
    sendFrames(socket, frames);
    const auto reply = recvFrames(socket, timeout);
    if (!reply) return std::nullopt;
    std::string why;
    auto m = decodeToVolunteer(*reply, 4 << 20, &why);
    EXPECT_TRUE(m.has_value()) << why;
    return m;
  }
  std::string refusal(const Frames& frames) {
    const auto m = ask(frames);
    if (!m) return "(no answer)";
    if (const auto* r = std::get_if<Rejected>(&*m)) return r->reason;
    return "(not rejected)";
  }
  CurveKeyPair keys;
  zmq::socket_t socket;
};

// What a volunteer's listen address does for the dial-back: answer `reach` to the coordinator's
// key, on its port and (`accept_too`) on the port + 1 (where dial-out-only peers would connect).
class FakeResponder {
 public:
  // `host`: "127.0.0.1", or "[::1]" (IPv6).
  FakeResponder(const CurveKeyPair& keys, const std::string& coordinator_key, bool accept_too = true,
                const std::string& host = "127.0.0.1")
      : zap_(context_, {{coordinator_key, "coordinator"}}) {
    const int port = testutil::freeLoopbackPorts(1)[0];  // the port above it is kept free too
    socket_ = coordinationServer(context_, keys, host + ":" + std::to_string(port), 1 << 16, &address_);
    std::string accept_address;
    if (accept_too)
      accept_ = coordinationServer(context_, keys, host + ":" + std::to_string(port + 1), 1 << 16,
                                   &accept_address);
    thread_ = std::thread([this] {
      while (!stop_)
        for (zmq::socket_t* s : {&socket_, &accept_}) {
          if (!*s) continue;
          const auto r = recvRouted(*s, milliseconds(25));
          if (!r) continue;
          std::string why;
          const auto m = decodeReach(r->frames, &why);
          if (const auto* check = m ? std::get_if<ReachCheck>(&*m) : nullptr)
            sendRouted(*s, r->routing_id, encode(ReachOk{check->nonce}));
        }
    });
  }
  ~FakeResponder() {
    stop_ = true;
    thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  zmq::context_t context_;
  ZapAuthenticator zap_;
  zmq::socket_t socket_, accept_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A volunteer that joined `coordinator` (its dial-back answered by its own responder, kept with
// it): `client` talks as the member called `name`.
struct JoinedMember {
  JoinedMember(zmq::context_t& ctx, const LiveCoordinator& coordinator)
      : client(ctx, coordinator.invite()), responder(client.keys, coordinator.invite().coordinator_key) {
    const auto accepted = client.ask(encode(goodAsk(responder.address())));
    if (!accepted || !std::holds_alternative<Accepted>(*accepted))
      throw std::runtime_error("the coordinator did not accept a good join");
    name = std::get<Accepted>(*accepted).name;
  }
  Client client;
  FakeResponder responder;
  std::string name;
};

}  // namespace cairn::coordinator::testing
