// A fake coordinator for volunteer-side unit tests: a CurveZMQ ROUTER on loopback (the real
// coordinationServer, admitting any client key through a real ZAP handler) whose test code reads
// one decoded message at a time and answers it by hand. Used by the checkpoint-upload and
// metrics-stream tests (tests/node/); the coordinator itself is tested in tests/coordinator/.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/protocol/Coordination.h"

namespace cairn::testing {

struct FakeCoordinator {
  // `port` 0: the kernel picks one (`bound` holds the address); `limit`: the largest attachment.
  explicit FakeCoordinator(size_t limit, int port = 0, CurveKeyPair k = generateCurveKeyPair())
      : limit(limit),
        keys(std::move(k)),
        router(coordinationServer(context, keys, "127.0.0.1:" + std::to_string(port), limit, &bound)) {}

  size_t limit;
  CurveKeyPair keys;
  zmq::context_t context;
  ZapAuthenticator zap{context, ZapAuthenticator::AnyKey{}};
  std::string bound;
  zmq::socket_t router;

  // The invite a volunteer would be given for this coordinator.
  Invite invite() const {
    Invite i;
    const auto colon = bound.rfind(':');
    i.host = bound.substr(0, colon);
    i.port = std::stoi(bound.substr(colon + 1));
    i.coordinator_key = keys.public_key;
    i.token = "00112233445566778899aabbccddeeff";
    return i;
  }

  // The next message within `wait`, which must decode as an `M` (anything else throws, naming
  // what was expected), with its route for the answer; nullopt when nothing came.
  template <class M>
  std::optional<std::pair<Routed, M>> next(std::chrono::milliseconds wait, const char* expected) {
    auto in = recvRouted(router, wait);
    if (!in) return std::nullopt;
    std::string why;
    auto m = decodeToCoordinator(in->frames, limit, &why);
    if (!m || !std::holds_alternative<M>(*m))
      throw std::runtime_error(std::string("the fake coordinator expected ") + expected +
                               " and got something else" + (why.empty() ? "" : ": " + why));
    return std::make_pair(std::move(*in), std::get<M>(std::move(*m)));
  }

  template <class Reply>
  void answer(const Routed& to, const Reply& reply) {
    sendRouted(router, to.routing_id, encode(reply));
  }
};

}  // namespace cairn::testing
