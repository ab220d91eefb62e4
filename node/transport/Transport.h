// The transport interface the rest of node/ is written against: send a Message to a named peer,
// receive the next valid Message from anyone, each with a timeout. Implementations: ZmqTransport
// (tcp:// for real runs, inproc:// for fast tests); later decorators (fault injection) wrap it.
// Thread-safety (docs/THREADS.md): implementations take send, receive, receiveOrLivenessChange,
// liveness and stats from several threads at once (a node's rings sync concurrently over one
// transport); addPeer and flushAndClose only while no other thread uses the instance.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <optional>
#include <string>

#include "node/transport/WireCodec.h"

namespace cairn {

enum class SendStatus {
  kSent,         // handed to the transport's queue for that peer
  kTimedOut,     // the peer's queue stayed full (or the peer never connected) for the whole timeout
  kUnknownPeer,  // no peer of that name was added
};
const char* toString(SendStatus status);

struct TransportStats {
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t bytes_sent = 0;      // tensor bytes
  uint64_t bytes_received = 0;  // tensor bytes
  uint64_t messages_dropped = 0;  // received but failed to decode (forged ones included)
  uint64_t messages_forged = 0;   // header sender differs from the authenticated peer
  uint64_t send_timeouts = 0;
  uint64_t messages_sent_same_host = 0;      // of messages_sent: over a same-host link (ZmqTransport)
  uint64_t messages_received_same_host = 0;  // of messages_received: over a same-host link
  // Relayed links (ZmqTransport, node/transport/RelayedLinks.h): messages the end-to-end layer
  // refused (tampered, out of order, replayed: asked for again), and messages sent again.
  uint64_t relayed_refused = 0;
  uint64_t relayed_resent = 0;
};

// What the transport knows of a peer's connection (docs/OPERATIONS.md "Failures while training").
enum class PeerState {
  kUnknown,       // never connected, or the transport cannot tell
  kConnected,     // connected (and, with heartbeats, answering them)
  kDisconnected,  // was connected; the connection is down (closed, or heartbeats went unanswered)
};
const char* toString(PeerState state);
struct PeerLiveness {
  PeerState state = PeerState::kUnknown;
  std::chrono::steady_clock::time_point since{};  // when it entered this state
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const std::string& name() const = 0;
  // Adds a peer this transport may send to; `endpoint` is a ZeroMQ endpoint ("tcp://h:p").
  virtual void addPeer(const std::string& peer, const std::string& endpoint) = 0;
  [[nodiscard]] virtual SendStatus send(const std::string& peer, const Message& message,
                                        std::chrono::milliseconds timeout) = 0;
  // The next message that decodes; malformed ones are dropped, counted and logged. nullopt when
  // nothing valid arrived within `timeout`.
  [[nodiscard]] virtual std::optional<Message> receive(std::chrono::milliseconds timeout) = 0;
  // Like receive(), but also returns nullopt early when some peer's liveness() changed or a signal
  // interrupted the wait, so a caller waiting on one peer can react to its connection going down
  // (or to a stop flag) without polling. Transports that
  // cannot tell liveness just receive().
  [[nodiscard]] virtual std::optional<Message> receiveOrLivenessChange(
      std::chrono::milliseconds timeout) {
    return receive(timeout);
  }
  virtual TransportStats stats() const = 0;
  // The connection state of an added peer as of the last send/receive call (those calls update
  // it; ZmqTransport: our outbound connection to the peer, with ZMTP heartbeats); transports that cannot tell answer kUnknown. Callers combine it with their own timeouts.
  virtual PeerLiveness liveness(const std::string& /*peer*/) const { return {}; }
  // Called by a send that waits for room, between its slices (ZmqTransport: every 50 ms), on the
  // sending thread with none of the transport's locks held; empty: none. Mailbox sets it to keep
  // the inbound flowing while every thread of a node is blocked sending. Set before sends start
  // (or with none in flight) and cleared before its owner goes. Default: ignored.
  virtual void setSendWaitHook(std::function<void()> /*hook*/) {}
  // The peer's process may have restarted at the same address (a ring member asking to join with
  // a new life): what is queued for it is dropped and the next send goes over a connection made
  // after this call. A connection made before may still end at the old process, its close not yet
  // seen, and swallow a message (the lost welcome of RingGatedAdmission, 4 runs in 40). Default
  // (and for links that send again what was lost: relayed): nothing.
  virtual void redial(const std::string& /*peer*/) {}
  // Waits up to `timeout` for queued outgoing messages to leave, then closes every socket.
  // Without a call, destruction abandons queued messages (linger 0).
  virtual void flushAndClose(std::chrono::milliseconds timeout) = 0;
};

}  // namespace cairn
