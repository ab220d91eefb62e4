// ZeroMQ implementation of Transport.
//
// Sockets: one PULL socket bound at this node's endpoint receives from every peer; one PUSH
// socket per peer, connected to that peer's endpoint, sends to it. A neighbour link therefore has
// two independent streams (our PUSH → their PULL, their PUSH → our PULL), each a separate
// connection with its own bounded queue (high-water marks), so activations flowing down never
// wait behind gradients flowing up. The PULL socket fair-queues between peers and refuses
// messages larger than max_message_bytes (ZMQ_MAXMSGSIZE) before they are buffered.
//
// Liveness (docs/OPERATIONS.md "Failures while training"): every PUSH socket sends ZMTP heartbeats
// (ZMQ_HEARTBEAT_IVL/TIMEOUT/TTL; ZeroMQ's I/O thread sends and answers them, so a node busy
// computing still answers) and is watched by a socket monitor (zmq_socket_monitor → an inproc PAIR
// socket owned by the same thread). receive() polls the monitors together with the PULL socket, so
// liveness(peer) follows the connection while waiting: kConnected after a completed handshake
// (CURVE included), kDisconnected when a connection that was up closes or misses heartbeats. A
// connection the peer's ZAP refused (our key not admitted yet) is dialled again on the next send:
// ZeroMQ itself gives such a connection up for good.
//
// Same host (docs/PROTOCOL.md "Same-host links"): with TransportOptions::same_host_dir set and this
// transport reached at a loopback address (tcp://127.x.y.z:PORT, localhost, *.localhost, ::1), it also listens
// on the Unix-domain socket ipc://DIR/PORT, and a peer whose endpoint is tcp on a loopback address
// (so on this host) is reached at ipc://DIR/<its port> instead: no TCP stack and no CurveZMQ encryption on a link that
// never leaves the machine. Messages on that socket are not CURVE-authenticated; sameHostDir() is
// the user's own directory (mode 0700, checked), so only processes of this user can connect —
// the same processes that can read the node's secret key file anyway.
//
// Reversed links (node/transport/ReversedLinks.h; docs/PROTOCOL.md "Reversed links"): a peer added
// with the endpoint kDialsUsEndpoint is dial-out only (behind a home router): no PUSH dials it;
// it dials us — its PUSH to our PULL as above, and a DEALER to our accept endpoint (PORT+1, a
// ROUTER bound when the first such peer is added) — and we send to it through that ROUTER once its
// DEALER attached. A transport made with TransportOptions::dial_out_only listens on nothing
// (bind endpoint empty) and, for every peer, opens that DEALER beside its PUSH. The same CURVE
// keys and ZAP handler serve every socket; liveness of a dial-out-only peer follows its attached
// connection; high-water marks, heartbeats, max_message_bytes and repointPeer hold for these
// links too. Reversed links are always TCP (no same-host socket).
//
// Relayed links (node/transport/RelayedLinks.h; docs/PROTOCOL.md "Relayed links"): a peer added
// with a relayed endpoint ("relay:KEY@tcp://HOST:PORT", for a link between two dial-out-only
// nodes) is reached through that relay, every message sealed end to end with the two nodes' keys
// and acknowledged; it needs CURVE. Its liveness is the relay's presence of it.
//
// Ownership: the transport owns its sockets; the zmq::context_t is borrowed (inproc:// endpoints
// need one context shared by both ends) and must outlive it.
// Thread-safety (docs/THREADS.md): send, receive, receiveOrLivenessChange, liveness and stats may
// be called from several threads at once (the rings of a node sync concurrently). Every socket is
// still used by one thread at a time, under a lock that gives ZeroMQ the memory barrier it asks
// for when a socket moves between threads: the PULL socket and the monitors under one receive
// lock (one receiver at a time; Mailbox makes the others wait for it), each PUSH socket under its
// own send lock (a send to one peer never waits behind a send to another). addPeer may run while
// other threads send and receive (a ring member added mid-run, node/transport/LivePeers.h): the peer map is
// under a reader/writer lock (peers_mutex_), a new peer's monitor is first polled by the next
// receive. Reversed links: the DEALERs of a dial-out-only node are the receiving thread's (under
// the receive lock); a reachable node's accept ROUTER is shared by its senders and the receiving
// thread under its own mutex, never blocking (a send to a dial-out-only peer whose queue is full
// retries every millisecond), so the receiving thread wakes at least every 20 ms while reversed
// links exist to read attaches (ReversedLinks.h). From the first relayed peer on, and on a
// dial-out-only node from its first peer on, the transport runs one thread of its own, the link
// keeper, which drains the receiving side (under the receive lock, taken only when free) every
// 50 ms, so a relayed link's resends and acknowledgements, and a dial-out-only node's attaches
// after its DEALER connected again, go on while no caller receives (keepLinks). flushAndClose is
// tear-down: it must not run concurrently with any other call; it stops the link keeper first.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "core/SendPacer.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/RelayedLinks.h"
#include "node/transport/ReversedLinks.h"
#include "node/transport/SameHostLinks.h"
#include "node/transport/Transport.h"

namespace cairn {

// CurveZMQ settings. A ZapAuthenticator admitting exactly the peers in `peer_public_keys` must be
// running in the transport's context before the transport is constructed (the provider makes one).
struct CurveOptions {
  CurveKeyPair own;
  std::map<std::string, std::string> peer_public_keys;  // peer name → Z85 public key
};

struct TransportOptions {
  int send_high_water_mark = 16;     // messages queued per peer before send() waits
  int receive_high_water_mark = 16;  // messages queued per peer on our side
  CodecLimits codec;                 // size limits enforced on receive
  std::optional<CurveOptions> curve;  // absent: plain TCP (only with --insecure)
  // ZeroMQ mallocs every received message; glibc serves large ones with fresh mmap()s (or trims
  // freed heap back to the system) so every received byte page-faults once (~37 000 faults per
  // 100 MB all-reduce round among 4 ranks, ~20% of its CPU). When set, the first transport of the
  // process raises glibc's mmap threshold (32 MiB) and trim threshold (256 MiB) so that message
  // buffers are reused instead: up to that much freed memory stays with the process.
  bool keep_message_memory = true;
  // ZMTP heartbeats on every PUSH socket: a PING every interval; no traffic for `timeout` closes the
  // connection (→ kDisconnected). 0 switches heartbeats off (a closed TCP connection is still seen).
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{5000};
  // Same-host links (above): the directory of the Unix-domain sockets, normally sameHostDir();
  // empty: every peer over TCP (and CURVE when set). Every node of a run must agree on it.
  std::string same_host_dir;
  // The endpoint peers dial to reach this transport ("tcp://" + node.json address), when it is not
  // the bound one (provider --bind): its port names the same-host socket. Empty: the bound one.
  std::string advertised_endpoint;
  // Dial-out only (a volunteer nobody can dial): the bind endpoint may be empty; every peer is
  // dialled with a PUSH and a receive-only DEALER to its accept endpoint (ReversedLinks.h).
  bool dial_out_only = false;
  // Where dial-out-only peers connect (bound when the first one is added). Empty: PORT+1 of the
  // bound endpoint (of advertised_endpoint's host when that is set, the bound host:PORT+1 being
  // only right without --bind: give it explicitly then).
  std::string accept_endpoint;
  // Relayed links: what waits unacknowledged this long is sent again (RelayedLinks.h).
  std::chrono::milliseconds relay_resend_after{1000};
  // Every send reserves its bytes here first and waits its turn (provider --join --max-mbps: the
  // volunteer's cap on what it sends; core/SendPacer.h); null: no cap.
  std::shared_ptr<SendPacer> pacer;
};

class ZmqTransport : public Transport {
 public:
  // Binds `bind_endpoint` (e.g. "tcp://127.0.0.1:5003", "inproc://node_3"; empty only with
  // options.dial_out_only). Throws BadInput when
  // the endpoint cannot be bound (port in use, bad address), naming it. With options.curve set,
  // inbound connections must authenticate (ZAP) and each message's header sender must equal the
  // authenticated peer name; others are dropped and counted (TransportStats::messages_forged).
  ZmqTransport(zmq::context_t& context, std::string name, const std::string& bind_endpoint,
               TransportOptions options = {});
  ~ZmqTransport() override;

  const std::string& name() const override { return name_; }
  void addPeer(const std::string& peer, const std::string& endpoint) override;
  // addPeer for a peer not known when the transport was made: with CURVE, `public_key` (Z85) is
  // recorded as the peer's server key first (ignored without CURVE). Nothing when the peer is
  // known already. Safe while other threads send and receive.
  void addPeer(const std::string& peer, const std::string& endpoint, const std::string& public_key);
  [[nodiscard]] SendStatus send(const std::string& peer, const Message& message,
                                std::chrono::milliseconds timeout) override;
  [[nodiscard]] std::optional<Message> receive(std::chrono::milliseconds timeout) override;
  [[nodiscard]] std::optional<Message> receiveOrLivenessChange(
      std::chrono::milliseconds timeout) override;
  PeerLiveness liveness(const std::string& peer) const override;
  void setSendWaitHook(std::function<void()> hook) override {
    std::lock_guard<std::mutex> lock(hook_mutex_);
    send_wait_hook_ = std::move(hook);
  }
  TransportStats stats() const override;
  void flushAndClose(std::chrono::milliseconds timeout) override;

  // Points the named peer at a new endpoint and CURVE server key (a ring peer whose volunteer
  // was replaced by a spare, node/transport/LivePeers.h): the old connection is dropped, the next one uses
  // them. A peer we dialled may become one that dials us (kDialsUsEndpoint: its node is now held
  // by a dial-out-only volunteer; BadInput when this node is dial-out only too) or one reached
  // through a relay (a relayed endpoint); a dial-out-only or relayed peer stays so (BadInput).
  // Done under that peer's send lock, like every send, so it may run while other threads send
  // and receive; a send waiting for room at the old endpoint leaves the lock to it within
  // kSendSlice and goes on to the new one. `public_key` is ignored without CURVE. False for an
  // unknown peer.
  bool repointPeer(const std::string& peer, const std::string& endpoint, const std::string& public_key);
  // Transport::redial: the peer's PUSH socket leaves its connection and dials the same endpoint
  // again (a dial-out-only peer: its attached connection is forgotten until it attaches again),
  // under the peer's send lock as repointPeer. Nothing for an unknown or relayed peer (a relayed
  // link acknowledges and sends again), or after flushAndClose.
  void redial(const std::string& peer) override;

  // The endpoint actually bound: with "tcp://127.0.0.1:*" (a port the kernel picks), the port it
  // picked, e.g. "tcp://127.0.0.1:41873". Safe from any thread (set in the constructor).
  const std::string& boundEndpoint() const { return bound_endpoint_; }
  // The same-host socket it also listens on ("ipc://DIR/PORT"), or empty (none: not on a loopback
  // address, or same_host_dir unset). Safe from any thread (set in the constructor).
  const std::string& sameHostEndpoint() const { return same_host_endpoint_; }
  // True when messages to `peer` go over a same-host link. False for an unknown peer.
  bool isSameHostPeer(const std::string& peer) const;
  // The endpoint dial-out-only peers connect to, once one was added (else empty).
  std::string acceptEndpoint() const { return accepted_ ? accepted_->boundEndpoint() : ""; }

  // The last decode error seen (for tests and metrics; read it while no other thread receives).
  const std::optional<DecodeError>& lastDecodeError() const { return last_error_; }

 private:
  zmq::context_t& context_;
  std::string name_;
  std::string bound_endpoint_;
  TransportOptions options_;
  struct Peer {
    zmq::socket_t socket;   // PUSH, connected to the peer's PULL (none: `accepted`); under *send_mutex
    zmq::socket_t monitor;  // PAIR receiving `socket`'s monitor events; under receive_mutex_
    PeerLiveness liveness;  // under liveness_mutex_
    std::unique_ptr<std::mutex> send_mutex = std::make_unique<std::mutex>();
    std::string endpoint;  // what `socket` connects to
    bool same_host = false;  // `endpoint` is the peer's same-host socket (no CURVE)
    // The peer's kind. Changed only by turnDirectLink, under *send_mutex and peers_mutex_ both
    // (read under either); its socket is closed then and its monitor kept, unpolled.
    bool accepted = false;   // a dial-out-only peer: sent to through accepted_ (no socket, monitor)
    bool relayed = false;    // reached through a relay: relayed_ (no socket, monitor)
    // Set when the peer's ZAP refused our key (a peer that does not admit us yet: a replaced
    // volunteer's neighbour before it applied the new peers); the next send dials again.
    std::unique_ptr<std::atomic<bool>> refused = std::make_unique<std::atomic<bool>>(false);
    // repointPeer calls waiting for send_mutex: a waiting send steps aside between its slices.
    std::unique_ptr<std::atomic<int>> repointing = std::make_unique<std::atomic<int>>(0);
  };
  // The longest a send holds a peer's send lock while it waits for room (send() above).
  static constexpr std::chrono::milliseconds kSendSlice{50};
  // How often the link keeper drains the receiving side while nobody receives.
  static constexpr std::chrono::milliseconds kLinkKeeperInterval{50};
  mutable std::mutex hook_mutex_;
  std::function<void()> send_wait_hook_;  // under hook_mutex_ (setSendWaitHook)
  // Reads every pending monitor event; true when some peer's state changed. Caller holds
  // receive_mutex_.
  bool drainMonitors();
  std::optional<Message> receiveImpl(std::chrono::milliseconds timeout, bool wake_on_liveness);
  // One message already queued on an inbound socket into `frames`, without waiting (`*same_host`:
  // it came over the same-host one); false when none is. Caller holds receive_mutex_.
  // `*dialed_peer`: the peer whose DEALER it came on (dial-out only), else empty.
  bool readInbound(std::vector<zmq::message_t>& frames, bool* same_host, std::string* dialed_peer);
  std::vector<zmq::pollitem_t> pollItems();  // caller holds receive_mutex_
  SendStatus sendAccepted(const std::string& peer, Peer& p, std::vector<zmq::message_t>& frames,
                          std::chrono::milliseconds timeout);
  SendStatus sendRelayed(const std::string& peer, std::vector<zmq::message_t>& frames,
                         std::chrono::milliseconds timeout);
  // A dial-out-only or relayed peer's send (sendAccepted, sendRelayed); nullopt for a peer we dial
  // (its kind read under peers_mutex_: turnDirectLink may change it).
  std::optional<SendStatus> sendIfNotDialled(const std::string& peer, Peer& p,
                                             std::vector<zmq::message_t>& frames,
                                             std::chrono::milliseconds timeout);
  std::string curveKeyOf(const std::string& peer) const;  // "" without CURVE; BadInput if unknown
  void addDialingPeerLocked(const std::string& peer);
  void addRelayedPeerLocked(const std::string& peer, const std::string& endpoint);
  // Takes a peer's send lock the way repointPeer and redial do: announced first, so a send
  // waiting for room leaves the lock to the caller at its next slice.
  std::unique_lock<std::mutex> lockForRepoint(Peer& p);
  // A directly dialled peer's socket leaves its endpoint and connects to `dial`. Caller holds the
  // peer's send lock.
  void reconnectLocked(const std::string& peer, Peer& p, const std::string& dial);
  // repointPeer of a peer we dialled to kDialsUsEndpoint or a relayed endpoint: its PUSH socket
  // closed, the peer added to accepted_ or relayed_ (and removed from dialed_), its kind changed.
  // False when another call turned it first (repointPeer then re-points it as such).
  bool turnDirectLink(const std::string& peer, Peer& p, const std::string& endpoint,
                      const std::string& public_key);
  // Sends that wait (for room, for a peer's acknowledgements) drain the receiving side meanwhile
  // when nobody else receives, then run the send wait hook.
  void whileSendWaits();
  void flushRelayed(std::chrono::milliseconds timeout);
  // The link keeper (ZmqTransportLinks.cpp): from the first relayed peer on (and a dial-out-only
  // node's first peer on), a thread that drains the receiving side every kLinkKeeperInterval
  // while no other thread receives, so a relayed link's acknowledgements, resends and attaches,
  // and a dial-out-only node's attaches, go on while the node computes or waits elsewhere.
  // Stopped first by flushAndClose.
  void keepLinks();
  void startLinkKeeperLocked();  // caller holds add_mutex_
  void stopLinkKeeper();

  // The same-host endpoint for a peer's tcp endpoint, or empty when it is not on this host.
  std::string sameHostEndpointFor(const std::string& tcp_endpoint) const;

  zmq::socket_t inbound_;                 // under receive_mutex_
  zmq::socket_t same_host_inbound_;       // PULL at same_host_endpoint_ (none: null); under receive_mutex_
  std::string same_host_endpoint_;
  bool prefer_same_host_ = false;          // alternates which inbound socket is read first
  // The map itself (and options_.curve->peer_public_keys) changes only in addPeer (under
  // peers_mutex_ exclusively, one addPeer at a time: add_mutex_) and flushAndClose; entries are
  // never erased while open, so a Peer found under a shared lock stays valid after it.
  std::map<std::string, Peer> outbound_;
  mutable std::shared_mutex peers_mutex_;
  std::mutex add_mutex_;
  Peer* findPeer(const std::string& peer) const;
  void addPeerLocked(const std::string& peer, const std::string& endpoint);
  std::mutex receive_mutex_;
  mutable std::mutex liveness_mutex_;
  mutable std::mutex stats_mutex_;
  TransportStats stats_;                   // under stats_mutex_
  std::optional<DecodeError> last_error_;  // written under receive_mutex_
  bool closed_ = false;
  std::unique_ptr<AcceptedLinks> accepted_;  // null: nothing bound (dial-out only)
  std::unique_ptr<DialedLinks> dialed_;      // set: dial-out only
  std::unique_ptr<RelayedLinks> relayed_;    // set with CURVE: peers reached through a relay
  std::thread link_keeper_;                  // started under add_mutex_; joined by stopLinkKeeper
  std::mutex keeper_mutex_;
  std::condition_variable keeper_wake_;
  bool keeper_stop_ = false;                 // under keeper_mutex_
  // A liveness change the keeper drained: the next receiveOrLivenessChange returns at once.
  std::atomic<bool> liveness_changed_{false};
};

}  // namespace cairn
