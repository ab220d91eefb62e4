// Relayed links: a link between two dial-out-only volunteers (each behind its own home router:
// neither can dial the other) goes through a relay, a reachable machine both dial
// (node/transport/Relay.h; a volunteer started with `provider --relay`, or the coordinator's
// `clusterize --serve --relay`). docs/PROTOCOL.md "Relayed links".
//
//   node A                             relay R (tcp://HOST:PORT)                node B
//     send DEALER ── ["D", B, sealed…] ──▶ ROUTER ── ["D", A, sealed…] ──▶ receive DEALER
//     receive DEALER ◀── ["P", names…] presence, ["D", B, sealed…] ◀────────── send DEALER
//
// Per relay, a node opens two DEALERs (CURVE clients to the relay's key with the node's own keys):
// one the senders share (under a mutex, never blocking: a sender waits for a full window on the
// link's condition variable, which acknowledgements wake, and retries a full queue after 1, 2, 4 …
// 16 ms), one owned by the receiving thread, which says `["A", NAME]`
// after each completed handshake and then once a second and gets the relay's presence answers
// (which of its partners are attached) and the messages of its peers. The relay reads nothing of
// a message but the destination; the sender is what its ZAP handler says.
//
// End to end (node/transport/RelaySeal.h): every message is sealed with the two volunteers' own
// Curve25519 keys and a per-direction session and sequence number, so the relay can neither read
// nor forge, reorder, replay or drop a message unseen. On top of that a small retransmission
// protocol (written here: no library here gives a sequenced, acknowledged channel over a relay)
// makes the link reliable whatever the relay does:
//   - the sender keeps each sent message (its sealed frames, shared, not copied) until the peer
//     acknowledges it, at most `window` messages (the send high-water mark): a send waits for room
//     in the window — the back-pressure of the link, end to end, whatever the relay queues;
//   - the receiver opens messages strictly in order and acknowledges them (a sealed control
//     message `ack(session, next)` after each batch it read); a message it refuses (tampered,
//     out of order, from a session it cannot start at) is dropped and it asks for everything from
//     the first it lacks (`resend(session, next)`, at most every 200 ms for the same point); a
//     duplicate is dropped and acknowledged again;
//   - the sender resends what is unacknowledged when asked, when its connection to the relay was
//     made again, when the link moved to another relay (repoint: a relay that died loses nothing),
//     and when nothing was acknowledged for a while (RelayedLinkOptions::resend_after, longer for
//     more bytes, doubling each time) while something waits;
//   - a peer that asks from a point the sender no longer holds has lost its state (it restarted):
//     the sender starts a new session from sequence 0 and forgets what waited, as a restarted
//     process's connection would.
// Control messages are sealed too (their own nonce space: a relay cannot turn one into data).
// Liveness of a relayed peer comes from its relay's presence: connected once a presence names it;
// disconnected once one no longer does after it did (the peer left the relay), or has not for
// 10 s since the link moved to that relay or our connection to it was made again (the peer never
// came); kUnknown before it was ever present. Losing our own connection to the relay changes no
// peer's liveness: the relay is gone, not the peer, and the link waits for the relay or for
// another (the coordinator moves it: coordinator/VolunteerRelays.h), like a slow link.
//
// Ownership: owns its sockets; the context is borrowed and must outlive it.
// Thread-safety: send() from any thread (a peer's send lock orders its sealing and sending; the
// relay's send lock guards the shared DEALER); drain(), read(), addPollItems() on the receiving
// thread only (the transport's receive lock); add() and repoint() from any thread (a mutex guards
// the maps; sockets are created or re-pointed under the relay's locks).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/transport/RelaySeal.h"
#include "node/transport/Transport.h"

namespace cairn {

// The endpoint a transport is given for a peer reached through a relay:
// "relay:" + the relay's Z85 public key (40 characters) + "@" + "tcp://HOST:PORT" (its relay port).
inline constexpr char kRelayedEndpointPrefix[] = "relay:";
bool isRelayedEndpoint(const std::string& endpoint);
std::string relayedEndpoint(const std::string& relay_key, const std::string& relay_address);
// Splits a relayed endpoint; false when it is not one (a key of 40 characters, then "@tcp://…").
bool parseRelayedEndpoint(const std::string& endpoint, std::string* relay_key,
                          std::string* relay_endpoint);

struct RelayedLinkOptions {
  size_t window = 16;  // messages sent and not yet acknowledged, per peer
  // What waits unacknowledged this long (plus a second per MB of it: a big message on a slow link
  // takes that long to cross) is sent again; doubled after each such resend until an
  // acknowledgement comes (the fast path is the receiver asking for what it lacks).
  std::chrono::milliseconds resend_after{1000};
  int receive_high_water_mark = 16;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  int64_t max_inbound_bytes = 0;  // ZMQ_MAXMSGSIZE of what the receiving DEALER takes (0: none)
  bool split_io_threads = false;
};

struct RelayedLinkStats {
  uint64_t refused = 0;      // messages the end-to-end layer refused (tampered, out of order, replayed)
  uint64_t resent = 0;       // messages sent again
  uint64_t sessions_restarted = 0;  // a peer asked from a point we no longer hold
};

class RelayedLinks {
 public:
  RelayedLinks(zmq::context_t& context, std::string name, CurveKeyPair own, RelayedLinkOptions options);
  ~RelayedLinks();
  RelayedLinks(const RelayedLinks&) = delete;
  RelayedLinks& operator=(const RelayedLinks&) = delete;

  // A peer reached through the relay at `relay_endpoint` (tcp://HOST:PORT) with `relay_key`;
  // `peer_key`: the peer's own public key (the end-to-end layer's). BadInput when it cannot dial.
  void add(const std::string& peer, const std::string& relay_endpoint, const std::string& relay_key,
           const std::string& peer_key);
  // The peer moved to another relay, or its volunteer was replaced (another key): carried out at
  // once; what waited unacknowledged is sent again through the new relay (same key), or forgotten
  // (another key: a new volunteer, a new session).
  void repoint(const std::string& peer, const std::string& relay_endpoint,
               const std::string& relay_key, const std::string& peer_key);
  bool has(const std::string& peer) const;
  bool active() const;
  bool allAcknowledged() const;  // nothing sent to a peer still there waits for its acknowledgement  // some peer is relayed (the receiving thread then wakes every 20 ms)

  // Seals and sends one encoded message (frames as encodeMessage makes them), waiting up to
  // `timeout` for room in the peer's window and in the relay's queue. `wait_hook` runs between
  // 50 ms slices of a wait (the transport drains its receiving side there); may be empty.
  SendStatus send(const std::string& peer, std::vector<zmq::message_t>& frames,
                  std::chrono::milliseconds timeout, const std::function<void()>& wait_hook);

  // Receiving thread: handshakes, attaches, presence, acknowledgements, resends; opens every data
  // message waiting and keeps the opened ones for read(). True when a peer's liveness changed.
  bool drain();
  void addPollItems(std::vector<zmq::pollitem_t>& items);
  // Receiving thread: one opened message and the peer it came from; false when none waits.
  bool read(std::vector<zmq::message_t>& frames, std::string* peer);
  PeerLiveness liveness(const std::string& peer) const;
  RelayedLinkStats stats() const;
  void close();

 private:
  struct Connection;  // one relay: its two DEALERs
  struct Link;        // one peer
  Connection& connectionLocked(const std::string& endpoint, const std::string& key);
  bool drainConnection(Connection& c, std::chrono::steady_clock::time_point now);
  void takeData(Connection& c, std::vector<zmq::message_t>& frames);
  void takeControl(Link& link, const std::string& peer, const std::string& payload);
  void acknowledge(Connection& c, const std::string& peer, Link& link, char kind, uint64_t session,
                   uint64_t next);
  void relayLost(Connection& c, std::chrono::steady_clock::time_point now);
  bool setPresence(Connection& c, const std::vector<std::string>& present,
                   std::chrono::steady_clock::time_point now);
  void resendDue(std::chrono::steady_clock::time_point now);
  std::chrono::milliseconds silence(uint64_t unacked_bytes, int resends) const;
  bool queueSealed(Connection& c, const std::string& peer, std::vector<zmq::message_t>& sealed);

  zmq::context_t& context_;
  std::string name_;
  CurveKeyPair own_;
  RelayedLinkOptions options_;
  mutable std::mutex mutex_;  // the maps below (not the links' or connections' own state)
  std::map<std::string, std::unique_ptr<Connection>> connections_;  // by relay endpoint + key
  std::map<std::string, std::unique_ptr<Link>> links_;              // by peer name
  std::deque<std::pair<std::string, std::vector<zmq::message_t>>> opened_;  // receiving thread
  mutable std::mutex stats_mutex_;
  RelayedLinkStats stats_;
};

}  // namespace cairn
