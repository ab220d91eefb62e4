// The relay: links two volunteers that can both only dial out (each behind its own home router),
// by forwarding their frames. A reachable machine runs it (`provider --relay`, or the coordinator
// `clusterize --serve --relay`); both ends dial it. The two ends seal every message end to end
// (node/transport/RelaySeal.h); the relay never looks inside a payload frame: it can neither read
// nor forge them, only forward, delay or drop them.
//
// Wire ("Relayed links" in docs/PROTOCOL.md):
//
//   volunteer A                        relay (tcp://HOST:PORT)                     volunteer B
//     DEALER ───── CURVE ─────────▶ ROUTER (CURVE server) ◀──────── CURVE ───── DEALER
//
// The relay binds a ROUTER: CURVE server with its own keys, behind its own ZAP handler (domain
// "cairn-relay") that admits only the members' keys, ZMTP heartbeats, ZMQ_ROUTER_MANDATORY,
// linger 0, ZMQ_MAXMSGSIZE. Each client is a DEALER, a CURVE client to the relay's public key with
// its own keys, with a routing id it draws afresh for each connection (like DialedLinks: libzmq
// ignores a second connection with an id still in use). Frame 0 of every message is a one-letter
// kind; every frame is binary, a name is its bytes (no terminator):
//
//   client → relay  ["A", NAME]              attach: after each completed handshake, then once a
//                                            second. Taken only when NAME is the member whose key
//                                            the connection authenticated with (else counted as
//                                            forged). NAME → this connection (the last attach
//                                            wins). Answered with a presence.
//   client → relay  ["D", TO, payload…]      data, at least one payload frame. The sender is the
//                                            member whose key the connection authenticated with,
//                                            never a name it claims. Refused (dropped, counted)
//                                            unless {sender, TO} is a planned pair.
//   relay → client  ["P", name…]             presence: which of the client's planned partners are
//                                            attached now, in byte order (possibly none).
//   relay → client  ["D", FROM, payload…]    data from member FROM, the payload frames as sent.
//
// Nothing else goes either way: any other message (no frames, another kind, "A" or "D" with the
// wrong number of frames, more than max_payload_frames payload frames) is dropped and counted.
//
// Presence is sent in answer to every attach, and, to a member's attached partners at once, when
// that member attaches anew (a new connection) or its attached connection closes (the ROUTER's
// socket monitor reports the closed socket; heartbeats close a silent one), and when setLinks
// changes the pairs. A presence that finds the client's pipe full is dropped: the next attach
// (within a second) gets a fresh one.
//
// Forwarding: a data message goes at once to TO's attached connection when TO's link from the
// sender has nothing waiting and TO's pipe has room; otherwise it waits in that link's queue
// (from → to), in order, behind what already waits, and the loop retries while the destination is
// attached (and at once when it attaches): when the cap lets the next message go, or after 1, 2,
// 4 … 16 ms while the pipe stays full; links take turns by message. Each link may hold
// link_budget_bytes waiting (each frame counts its size plus kRelayFrameOverhead); a message that
// would exceed it is dropped (refused_over_budget). The queues of a destination that has not been
// attached for unattached_drop_after are dropped (dropped_waiting), and so are those of a pair no
// longer planned. The relay never reorders the messages of one link; it may drop some (the seal
// layer above sees a gap and recovers).
//
// Pacing (max_mbps, `provider --relay-mbps`): the rule of core/SendPacer.h (GCRA, burst
// max(256 KiB, 0.1 s at the rate)) applied on the loop without waiting: a message goes when the
// schedule allows, otherwise it waits in its link's queue (and counts against the budget), so one
// paced link never stops the loop.
//
// Identity: the ZAP handler gives each connection the User-Id "NAME KEY" (the member's name, a
// space, its Z85 key); a message counts only while that is still a member's name and key, so a
// connection made with a key that setLinks has since replaced or removed is ignored (revoked),
// although libzmq keeps it open.
//
// Memory: a hostile member can make the relay hold at most link_budget_bytes per planned link it
// is in, plus what libzmq buffers per connection (receive_high_water_mark and
// send_high_water_mark messages, each frame at most max_message_bytes; libzmq bounds neither the
// frames of one message nor its total size, so set max_message_bytes on a public relay).
//
// Thread-safety: one loop thread owns the sockets; setLinks(), stats() and boundEndpoint() from
// any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include <zmq.hpp>

#include "core/CurveKeys.h"

namespace cairn {

class RelayLoop;         // node/transport/RelayLoop.h
class ZapAuthenticator;  // node/transport/CurveSecurity.h

// The kinds (frame 0) of the relay's wire.
inline constexpr char kRelayAttach[] = "A";
inline constexpr char kRelayData[] = "D";
inline constexpr char kRelayPresence[] = "P";
// The member name the coordinator attaches with to check that a volunteer's relay answers at its
// advertised address (coordinator/Admissions.h); a volunteer's relay always admits it, with no link.
inline constexpr char kRelayCoordinatorMember[] = "coordinator";
// The ZAP domain of the relay's ROUTER.
inline constexpr char kRelayZapDomain[] = "cairn-relay";
// What a waiting frame counts against its link's budget besides its bytes (its bookkeeping).
inline constexpr uint64_t kRelayFrameOverhead = 64;

struct RelayOptions {
  std::string bind_endpoint;             // "tcp://0.0.0.0:7102"; "tcp://127.0.0.1:*" picks a port
  CurveKeyPair own;                      // the relay's CURVE server keys (always CURVE)
  int64_t max_message_bytes = 0;         // ZMQ_MAXMSGSIZE (per frame) of what it receives (0: none;
                                         // raised to 4096 at least: the handshake must fit)
  int64_t link_budget_bytes = 256 << 20; // bytes one link (from→to) may have waiting at the relay
  double max_mbps = 0;                   // cap on payload bytes forwarded per second (0: none)
  // ZMTP heartbeats on the clients' connections: off (0) by default, TCP keepalives instead
  // (setRelayKeepalive: a vanished client is gone within ~10 s). libzmq's heartbeats close a
  // healthy connection whose reader is slow (it cannot see a PING behind data it does not read)
  // and may then abort (libzmq issue 3937); a relay's clients are readers of bulk data.
  std::chrono::milliseconds heartbeat_interval{0}, heartbeat_timeout{5000};
  size_t max_payload_frames = 1025;      // frames of one data message (a wire message: header +
                                         // CodecLimits::max_tensors)
  int send_high_water_mark = 64;         // messages libzmq queues per client (ZMQ_SNDHWM)
  int receive_high_water_mark = 64;      // and per connection inbound (ZMQ_RCVHWM)
  std::chrono::milliseconds unattached_drop_after{30000};  // drop queues for one not attached
  // Tests only (provider --relay under CAIRN_TEST_RELAY_TAMPER=SEED): a hostile relay. Non-zero: of
  // the data messages it takes, drawn from this seed, one in 32 is dropped, one in 32 has a bit of
  // a payload frame flipped, one in 32 goes twice, one in 32 is held back and goes after the next
  // (reordered). Counted in RelayStats::tampered.
  uint64_t test_tamper_seed = 0;
};

struct RelayStats {  // all counters since start
  uint64_t messages_forwarded = 0, bytes_forwarded = 0;  // bytes: payload frames' sizes
  uint64_t refused_unplanned = 0;    // from→to not a planned pair, or an unknown destination
  uint64_t refused_over_budget = 0;  // the link's budget was full: dropped
  uint64_t forged_attaches = 0;      // an attach naming another member than the connection's key
  uint64_t malformed = 0;            // not a message of the wire (above)
  uint64_t revoked = 0;              // from a connection whose key is no longer a member's
  uint64_t dropped_waiting = 0;      // waited, then dropped: destination gone too long, or the
                                     // pair no longer planned
  uint64_t attaches = 0;             // attaches taken
  uint64_t tampered = 0;             // test_tamper_seed: messages dropped, flipped, doubled, held
  uint64_t refused_keys = 0;         // connections whose key ZAP refused (not a member's)
  uint64_t messages_waiting = 0, bytes_waiting = 0;  // now, in all the links' queues (payload)
  uint64_t loop_turns = 0;           // the loop's waits (each poll of its sockets): its wakeups
  std::map<std::pair<std::string, std::string>, uint64_t> bytes_per_link;  // (from,to) → bytes
};

// TCP keepalives on a relay connection (the relay's ROUTER, a relayed link's receiving DEALER):
// probes after 5 s of silence, one a second, the connection closed after 5 unanswered.
void setRelayKeepalive(zmq::socket_t& socket);

class Relay {
 public:
  // Owns its own zmq::context_t, ZapAuthenticator and one thread. BadInput naming the endpoint
  // when it cannot bind (or the keys are not Z85).
  explicit Relay(RelayOptions options);
  // Stops the thread and closes everything, within a second.
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Whom it relays for: members (name → Z85 public key; only these keys get in, by ZAP) and the
  // planned pairs (unordered: {a,b} allows a→b and b→a; a pair naming a non-member is ignored).
  // Replaces the previous set (a volunteer replaced mid-run): the connections of members no
  // longer listed, or listed with another key, are forgotten and ignored from then on. Any thread.
  void setLinks(std::map<std::string, std::string> members,
                std::set<std::pair<std::string, std::string>> pairs);
  std::string boundEndpoint() const;  // "tcp://127.0.0.1:41873" after binding
  RelayStats stats() const;           // any thread

 private:
  RelayOptions options_;
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<ZapAuthenticator> zap_;
  std::unique_ptr<RelayLoop> loop_;
  std::string bound_endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace cairn
