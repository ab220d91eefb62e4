// CurveZMQ for cairn: key pairs, secret key files, and the ZAP handler that admits only peers
// whose public keys a node was given (its neighbours and ring peers, from node.json).
//
// With security on, every connection is encrypted and mutually authenticated: a node's PULL
// socket is a CURVE server that asks the ZapAuthenticator about each connecting client key; a
// PUSH socket is a CURVE client that only talks to the server key it was given. The
// authenticator tells ZeroMQ the peer's *name* as the connection's User-Id, and ZmqTransport drops
// any message whose header claims a different sender — a peer cannot speak for another.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <mutex>
#include <thread>

#include <zmq.hpp>

#include "core/CurveKeys.h"

namespace cairn {

// The ZAP handler (RFC 27) of one zmq::context_t: a thread owning a REP socket bound at
// inproc://zeromq.zap.01. Construct it before binding any CURVE server socket in that context;
// destroy it after them. `allowed` maps public key → peer name. Thread-safety: rejected() from any
// thread; the rest is its own thread.
class ZapAuthenticator {
 public:
  ZapAuthenticator(zmq::context_t& context, std::map<std::string, std::string> allowed);
  // Any key gets in (the coordinator: a joining volunteer proves itself with the invite's token,
  // not with a key known in advance); its User-Id is the key itself (Z85), so every message says
  // which key sent it. Keys in `allowed` still get their name as User-Id.
  struct AnyKey {};
  ZapAuthenticator(zmq::context_t& context, AnyKey);
  // Replaces the admitted keys (a peer replaced mid-run); connections already up stay up.
  void setAllowed(std::map<std::string, std::string> allowed);
  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

  uint64_t accepted() const { return accepted_.load(); }
  uint64_t rejected() const { return rejected_.load(); }

 private:
  ZapAuthenticator(zmq::context_t& context, std::map<std::string, std::string> allowed, bool any_key);
  void run();

  std::mutex mutex_;  // guards allowed_ (setAllowed from another thread)
  std::map<std::string, std::string> allowed_;
  bool any_key_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0}, rejected_{0};
  // Refusals by key, for the log (the thread's own): at most kMaxRefusedKeys keys, the rest
  // counted under one entry, so a flood of made-up keys cannot grow it.
  static constexpr size_t kMaxRefusedKeys = 256;
  std::map<std::string, uint64_t> refused_by_key_;
  zmq::socket_t socket_;
  std::thread thread_;
};

}  // namespace cairn
