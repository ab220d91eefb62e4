#include "node/transport/RelayedLinks.h"

#include <algorithm>
#include <cstring>

#include <zmq_addon.hpp>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/Relay.h"
#include "node/transport/RelayedLinksState.h"
#include "node/transport/ZmqSockets.h"

namespace cairn {
namespace {

constexpr std::chrono::milliseconds kSendSlice{50};
constexpr std::chrono::milliseconds kSendRetryMax{16};  // send(): the longest wait for room
constexpr size_t kKeyChars = 40;

}  // namespace

bool isRelayedEndpoint(const std::string& endpoint) {
  return endpoint.rfind(kRelayedEndpointPrefix, 0) == 0;
}

std::string relayedEndpoint(const std::string& relay_key, const std::string& relay_address) {
  const std::string tcp = relay_address.find("://") == std::string::npos ? "tcp://" + relay_address
                                                                         : relay_address;
  return kRelayedEndpointPrefix + relay_key + "@" + tcp;
}

bool parseRelayedEndpoint(const std::string& endpoint, std::string* relay_key,
                          std::string* relay_endpoint) {
  const size_t prefix = std::strlen(kRelayedEndpointPrefix);
  if (!isRelayedEndpoint(endpoint) || endpoint.size() <= prefix + kKeyChars + 1 ||
      endpoint[prefix + kKeyChars] != '@')
    return false;
  *relay_key = endpoint.substr(prefix, kKeyChars);
  *relay_endpoint = endpoint.substr(prefix + kKeyChars + 1);
  return isZ85Key(*relay_key) && relay_endpoint->rfind("tcp://", 0) == 0;
}

RelayedLinks::RelayedLinks(zmq::context_t& context, std::string name, CurveKeyPair own,
                           RelayedLinkOptions options)
    : context_(context), name_(std::move(name)), own_(std::move(own)), options_(options) {}

RelayedLinks::~RelayedLinks() { close(); }

RelayedLinks::Connection& RelayedLinks::connectionLocked(const std::string& endpoint,
                                                         const std::string& key) {
  auto& slot = connections_[endpoint + "|" + key];
  if (slot) return *slot;
  auto c = std::make_unique<Connection>();
  c->endpoint = endpoint;
  c->key = key;
  auto dealer = [&](int hwm, uint64_t affinity, const std::string& what, zmq::socket_t* monitor,
                    bool heartbeats) {
    zmq::socket_t s(context_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::sndhwm, hwm);
    s.set(zmq::sockopt::rcvhwm, options_.receive_high_water_mark);
    if (options_.max_inbound_bytes > 0) s.set(zmq::sockopt::maxmsgsize, options_.max_inbound_bytes);
    // ZMTP heartbeats only on the sending DEALER, whose inbound carries nothing (the relay never
    // sends on it): on the receiving one a PING waits behind data a slow reader has not read and
    // libzmq closes the healthy connection, then may abort (libzmq issue 3937; Relay.h). The
    // receiving DEALER has TCP keepalives; the sending one's heartbeats tell a relay that died.
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::reconnect_ivl, 100);
    s.set(zmq::sockopt::reconnect_ivl_max, 1000);
    if (heartbeats) setZmtpHeartbeats(s, options_.heartbeat_interval, options_.heartbeat_timeout);
    else setRelayKeepalive(s);
    s.set(zmq::sockopt::curve_serverkey, key);
    s.set(zmq::sockopt::curve_publickey, own_.public_key);
    s.set(zmq::sockopt::curve_secretkey, own_.secret_key);
    if (options_.split_io_threads) s.set(zmq::sockopt::affinity, affinity);
    *monitor = monitorSocket(context_, s,
                             ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                 ZMQ_EVENT_DISCONNECTED,
                             name_, what);
    try {
      allowIpv6For(s, endpoint);
      s.connect(endpoint);
    } catch (const zmq::error_t& e) {
      zmq_socket_monitor(s.handle(), nullptr, 0);
      CAIRN_THROW(BadInput, name_, ": cannot dial the relay at ", endpoint, ": ", e.what());
    }
    return s;
  };
  c->send_socket = dealer(static_cast<int>(options_.window), 2, "relay-out", &c->send_monitor, true);
  c->receive_socket = dealer(4, 1, "relay-in", &c->receive_monitor, false);
  slot = std::move(c);
  CAIRN_DEBUG(name_, ": dialling the relay at ", endpoint);
  return *slot;
}

void RelayedLinks::add(const std::string& peer, const std::string& relay_endpoint,
                       const std::string& relay_key, const std::string& peer_key) {
  if (!isZ85Key(relay_key) || !isZ85Key(peer_key))
    CAIRN_THROW(BadInput, name_, ": peer ", peer, " is relayed, which needs CURVE keys for it and its",
                " relay (a relayed link is sealed end to end with them; not with --insecure)");
  std::lock_guard<std::mutex> lock(mutex_);
  if (links_.count(peer)) return;
  Connection& c = connectionLocked(relay_endpoint, relay_key);
  auto link = std::make_unique<Link>(own_, peer_key);
  link->connection = &c;
  links_.emplace(peer, std::move(link));
}

void RelayedLinks::repoint(const std::string& peer, const std::string& relay_endpoint,
                           const std::string& relay_key, const std::string& peer_key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(peer);
  if (it == links_.end()) return;
  Link& link = *it->second;
  Connection& c = connectionLocked(relay_endpoint, relay_key);
  std::lock_guard<std::mutex> state(link.state);
  if (peer_key != link.peer_key) {  // another volunteer: nothing of the old one's link carries over
    link.peer_key = peer_key;
    link.sealer = LinkSealer(own_, peer_key);
    link.next_sequence = 0;
    link.unacked.clear();
    link.unacked_bytes = 0;
    link.resend_from.reset();
    link.room.notify_all();
    link.receiver_key = peer_key;  // the receiving side's, replaced by its own thread (drain)
  } else if (!link.unacked.empty()) {
    link.resend_from = link.unacked.front().first;  // what the old relay may have lost
  }
  if (link.connection != &c) {  // its liveness stays until the new relay says (setPresence)
    link.connection = &c;
    link.seen_here = c.connected && c.present.count(peer) > 0;
    link.here_since = std::chrono::steady_clock::now();
  }
}

bool RelayedLinks::has(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return links_.count(peer) > 0;
}

bool RelayedLinks::active() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !links_.empty();
}

bool RelayedLinks::allAcknowledged() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [peer, link] : links_) {
    // A peer its relay says has left acknowledges nothing more: a node restarting after its
    // neighbour was lost waited the whole flush timeout for it (5 s per restart).
    if (link->liveness.state == PeerState::kDisconnected) continue;
    std::lock_guard<std::mutex> state(link->state);
    if (!link->unacked.empty()) return false;
  }
  return true;
}

// Caller holds the link's state lock. Queues ["D", peer, sealed…] without waiting.
bool RelayedLinks::queueSealed(Connection& c, const std::string& peer,
                               std::vector<zmq::message_t>& sealed) {
  std::lock_guard<std::mutex> sending(c.send_mutex);
  zmq::message_t kind("D", 1);
  if (!c.send_socket.send(kind, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
  zmq::message_t to(peer.data(), peer.size());
  (void)c.send_socket.send(to, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  for (size_t i = 0; i < sealed.size(); ++i) {
    const auto more = i + 1 < sealed.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    auto sent = c.send_socket.send(sealed[i], more | zmq::send_flags::dontwait);
    CAIRN_ENFORCE(sent.has_value(), "ZeroMQ refused frame ", i, " of a relayed message");
  }
  return true;
}

SendStatus RelayedLinks::send(const std::string& peer, std::vector<zmq::message_t>& frames,
                              std::chrono::milliseconds timeout,
                              const std::function<void()>& wait_hook) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto next_hook = std::chrono::steady_clock::now() + kSendSlice;
  // Sealed once per (session, sequence): a wait for room does not encrypt the message again.
  std::vector<zmq::message_t> sealed;
  uint64_t sealed_session = 0, sealed_sequence = 0;
  // How long to wait for room before trying again: 1 ms, doubling up to kSendRetryMax. A window
  // that opens wakes the wait at once (Link::room); a full pipe tells no one (libzmq), hence the
  // retries. (Before, a sender tried every millisecond for as long as its window stayed full.)
  std::chrono::steady_clock::duration retry = std::chrono::milliseconds(1);
  for (;;) {
    Link* link = nullptr;
    Connection* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = links_.find(peer);
      if (it == links_.end()) return SendStatus::kUnknownPeer;
      link = it->second.get();
      c = link->connection;
    }
    {
      std::unique_lock<std::mutex> state(link->state);
      if (!link->resend_from && link->unacked.size() < options_.window) {
        if (sealed.empty() || sealed_session != link->sealer.session() ||
            sealed_sequence != link->next_sequence) {
          sealed = link->sealer.sealAt(frames, link->next_sequence);
          sealed_session = link->sealer.session();
          sealed_sequence = link->next_sequence;
        }
        // Kept sealed (new buffers): the caller's frames — a collective's tensors, sent zero-copy
        // — are released when this returns, as after any send (CollectiveChannel waits for it).
        std::vector<zmq::message_t> kept = shareFrames(sealed);
        if (queueSealed(*c, peer, sealed)) {
          if (link->unacked.empty()) link->progress_at = std::chrono::steady_clock::now();
          for (const auto& f : kept) link->unacked_bytes += f.size();
          link->unacked.emplace_back(link->next_sequence++, std::move(kept));
          return SendStatus::kSent;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now < deadline && now < next_hook)
        link->room.wait_for(state, std::min({retry, deadline - now, next_hook - now}));
    }
    retry = std::min<std::chrono::steady_clock::duration>(2 * retry, kSendRetryMax);
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return SendStatus::kTimedOut;
    if (now >= next_hook) {
      next_hook = now + kSendSlice;
      if (wait_hook) wait_hook();
    }
  }
}

}  // namespace cairn
