// Reversed links: a link where one side is dial-out only (a volunteer behind a home router or a
// firewall: it can dial out, nobody can dial in; docs/OPERATIONS.md "Behind a home router"). The
// dial-out-only side opens every connection of such a link and traffic flows both ways over them:
//
//   dial-out-only node D                         reachable node R (tcp://HOST:PORT)
//     PUSH ──────────────── D → R ──────────────▶ PULL  at HOST:PORT    (as on every link)
//     DEALER (routing id D) ◀──── R → D ───────── ROUTER at HOST:PORT+1 (the accept endpoint)
//
// D's DEALER connects to R's accept endpoint with a routing id drawn afresh for each connection (D
// dials again itself when one closes, keeping what came over it unread) and, after each completed
// handshake and then once a second, says `attach NAME` (one frame, kAttachFrame + " " + its name);
// R sends to D through its ROUTER, addressed by the routing id of the connection that attached
// last, only while that connection is up. Both sockets are CURVE with the same keys as every link
// (R's ROUTER is a CURVE server behind the node's ZAP handler, D's DEALER a client that only talks
// to R's server key): R takes an attach only when NAME is the name ZAP gave the connecting key
// (else it is counted as forged), and D takes a message from its DEALER only when the header's
// sender is the peer that DEALER dials. Liveness of D at R follows the attached connection (the
// ROUTER's monitor reports it closed: kDisconnected); ZMTP heartbeats on both sockets close a
// connection whose other end went silent. Links between two dial-out-only nodes cannot be made here
// (a relay is needed): the transport refuses them, the planner never makes them.
//
// Ownership: each class owns its sockets; the context is borrowed and must outlive them.
// Thread-safety: AcceptedLinks' ROUTER is shared by the senders (tryQueue) and the receiving
// thread (drain), every use under its one mutex and never blocking; its monitor belongs to the
// receiving thread. DialedLinks' sockets belong to the receiving thread (the transport's receive
// lock); add() and repoint() may come from other threads (a mutex guards the map; a re-pointing is
// carried out by the receiving thread's next drain()).
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/transport/Transport.h"

namespace cairn {

// The endpoint a transport is given for a peer that dials us (a dial-out-only peer, node.json
// "dial_out_only"): we never dial it; it connects to our accept endpoint.
inline constexpr char kDialsUsEndpoint[] = "dials-us:";
bool isDialsUsEndpoint(const std::string& endpoint);
// The accept endpoint of a node reached at tcp://HOST:PORT: tcp://HOST:PORT+1 (docs/PROTOCOL.md
// "Reversed links"). Empty when `endpoint` is not tcp:// with a numeric port below 65535.
std::string acceptEndpointOf(const std::string& endpoint);
// The one frame a dial-out-only node's DEALER sends after each completed handshake.
inline constexpr char kAttachFrame[] = "cairn-attach-1";

struct ReversedLinkOptions {
  int send_high_water_mark = 16;
  int receive_high_water_mark = 16;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  int64_t max_inbound_bytes = 0;  // ZMQ_MAXMSGSIZE of what a DEALER receives
  const CurveKeyPair* own = nullptr;  // null: plain TCP (--insecure); else CURVE with these keys
  bool split_io_threads = false;      // two or more I/O threads: in on the first, out on the second
};

// The reachable side: a ROUTER bound at the accept endpoint (on the first add(), so a node with no
// dial-out-only peer binds nothing more).
class AcceptedLinks {
 public:
  AcceptedLinks(zmq::context_t& context, std::string name, std::string bind_endpoint,
                ReversedLinkOptions options);
  ~AcceptedLinks();
  AcceptedLinks(const AcceptedLinks&) = delete;
  AcceptedLinks& operator=(const AcceptedLinks&) = delete;

  // A peer that dials us. BadInput naming the endpoint when it cannot be bound.
  void add(const std::string& peer);
  // Forgets the peer's connection (its volunteer was replaced): the next holder must attach again.
  void reset(const std::string& peer);
  // The endpoint bound ("tcp://HOST:PORT"), empty before the first add().
  std::string boundEndpoint() const;

  enum class Queued { kSent, kNoRoom, kNotAttached };
  // Queues a whole message for `peer` without waiting: kNoRoom when its queue is full,
  // kNotAttached when it has no attached connection now. Any thread.
  Queued tryQueue(const std::string& peer, std::vector<zmq::message_t>& frames);
  // Receiving thread: closed connections and new attaches; true when some peer's liveness changed.
  // `*forged` counts attaches whose routing id was not the authenticated name.
  bool drain(uint64_t* forged);
  // Receiving thread: the monitor to poll (none before the first add()).
  void addPollItems(std::vector<zmq::pollitem_t>& items);
  bool bound() const;
  PeerLiveness liveness(const std::string& peer) const;
  // `linger`: how long what is still queued for the dial-out-only peers may take to leave once
  // closed (ZMQ_LINGER; the context holds it meanwhile). 0 drops it.
  void close(std::chrono::milliseconds linger = std::chrono::milliseconds(0));

 private:
  struct Link {
    PeerLiveness liveness;
    int fd = -1;             // the attached connection's socket (ZMQ_SRCFD), -1 when none
    std::string routing_id;  // the attached connection's (drawn by the peer for each connection)
  };
  void bindLocked();
  bool readAttachLocked(uint64_t* forged);
  zmq::context_t& context_;
  std::string name_;
  std::string bind_endpoint_;
  ReversedLinkOptions options_;
  mutable std::mutex mutex_;  // router_, links_, bound_endpoint_
  zmq::socket_t router_;
  zmq::socket_t monitor_;  // receiving thread (created under mutex_ by the first add)
  std::string bound_endpoint_;
  std::map<std::string, Link> links_;
};

// The dial-out-only side: one DEALER per (reachable) peer, receive-only, at its accept endpoint.
class DialedLinks {
 public:
  DialedLinks(zmq::context_t& context, std::string name, ReversedLinkOptions options);
  ~DialedLinks();
  DialedLinks(const DialedLinks&) = delete;
  DialedLinks& operator=(const DialedLinks&) = delete;

  // `server_key`: the peer's Z85 public key (ignored without CURVE). BadInput when it cannot dial.
  void add(const std::string& peer, const std::string& accept_endpoint, const std::string& server_key);
  // The peer moved (a replacement): carried out by the receiving thread's next drain().
  void repoint(const std::string& peer, const std::string& accept_endpoint,
               const std::string& server_key);
  // The link to `peer` goes elsewhere (a dial-out-only volunteer took its node over: the two meet
  // at a relay now, ZmqTransport::repointPeer): its DEALER is closed by the receiving thread's
  // next drain(), and nothing more is read from it.
  void remove(const std::string& peer);
  // Receiving thread: attaches after handshakes, pending re-pointings, dialling again after a
  // refusal (the transport's receiving thread wakes often enough for it: ZmqTransport).
  void drain();
  void addPollItems(std::vector<zmq::pollitem_t>& items);
  // Receiving thread: one queued message and the peer whose DEALER it came on; false when none.
  bool read(std::vector<zmq::message_t>& frames, std::string* peer);
  void close();

 private:
  struct Dialed {
    zmq::socket_t socket;   // DEALER
    zmq::socket_t monitor;  // PAIR with the DEALER's handshake events
    std::string endpoint;
    std::string pending_endpoint, pending_key;  // a repoint() not carried out yet
    bool pending = false;
    bool refused = false;  // the peer's ZAP refused our key: dialled again after a pause
    std::chrono::steady_clock::time_point refused_at;
    bool connected = false;  // a handshake completed
    bool closed = false;     // that connection closed: dialled again with a fresh routing id
    bool removed = false;    // remove(): closed and forgotten by the next drain()
    // Read from a closed connection before it was dialled again, not yet handed out by read().
    std::deque<std::vector<zmq::message_t>> kept;
    std::chrono::steady_clock::time_point attached_at;  // the last attach sent
  };
  static constexpr std::chrono::milliseconds kRedialAfterRefusal{200};
  static constexpr std::chrono::milliseconds kReattach{1000};
  zmq::context_t& context_;
  std::string name_;
  ReversedLinkOptions options_;
  std::mutex mutex_;  // the map and the pending fields
  std::map<std::string, std::unique_ptr<Dialed>> links_;
  size_t next_read_ = 0;  // receiving thread: fair turns between the DEALERs
};

}  // namespace cairn
