// ReachabilityResponder: while a volunteer joins (and waits as a spare), its --listen address
// answers the coordinator's reachability check (docs/PROTOCOL.md "Coordination"): a ROUTER bound
// at --listen, a CurveZMQ server with the volunteer's own key, behind a ZapAuthenticator that
// admits only the coordinator's key (from the invite). One thread answers each `reach{nonce}`
// with `reach_ok{nonce}`; anything else is dropped and counted. stop() releases the port before
// it returns, so the training transport can bind the same address right after.
//
// Ownership: owns its socket, its thread and the ZapAuthenticator of `context` (the one handler a
// context can have, inproc://zeromq.zap.01: no other CURVE server may live in that context while
// the responder runs); `context` is borrowed and must outlive it.
// Thread-safety: the socket belongs to the responder's thread; stop() and the counters may be
// called from any one thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/transport/CurveSecurity.h"

namespace cairn {

class ReachabilityResponder {
 public:
  // Binds `listen` ("host:port"; port 0 or *: one the kernel picks, see bound()). BadInput naming
  // the address when it cannot be bound.
  ReachabilityResponder(zmq::context_t& context, const CurveKeyPair& own,
                        const std::string& coordinator_key, const std::string& listen);
  ~ReachabilityResponder();  // stop()
  ReachabilityResponder(const ReachabilityResponder&) = delete;
  ReachabilityResponder& operator=(const ReachabilityResponder&) = delete;

  // The address bound, "host:port" with the kernel's port.
  const std::string& bound() const { return bound_; }
  // Stops answering, closes the listening socket and waits until its port is released (ZeroMQ
  // closes listeners asynchronously: it waits for the socket monitor's "closed" event, up to 5 s).
  void stop();

  uint64_t answered() const { return answered_.load(); }
  // Messages that were not a valid reach check (malformed, another type, too many frames).
  uint64_t dropped() const { return dropped_.load(); }
  // Connections whose CURVE key was not the coordinator's.
  uint64_t refused() const { return authenticator_ ? authenticator_->rejected() : refused_at_stop_; }

 private:
  void run();

  zmq::context_t& context_;
  std::unique_ptr<ZapAuthenticator> authenticator_;
  zmq::socket_t socket_;
  zmq::socket_t monitor_;  // PAIR receiving socket_'s monitor events
  std::string bound_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> answered_{0}, dropped_{0};
  uint64_t refused_at_stop_ = 0;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace cairn
