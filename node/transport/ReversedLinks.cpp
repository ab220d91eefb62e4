#include "node/transport/ReversedLinks.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include <zmq_addon.hpp>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/ZmqSockets.h"

namespace cairn {
namespace {

void setReversedHeartbeats(zmq::socket_t& socket, const ReversedLinkOptions& o) {
  socket.set(zmq::sockopt::linger, 0);
  setZmtpHeartbeats(socket, o.heartbeat_interval, o.heartbeat_timeout);
}

std::string frameText(const zmq::message_t& frame) {
  return std::string(static_cast<const char*>(frame.data()), frame.size());
}

// A routing id for one connection: the name and a number drawn afresh, so that a ROUTER still
// holding the id of a connection of ours that just closed never ignores the next one (libzmq
// ignores a second pipe with an id in use, for good) and nobody can guess it.
std::string freshRoutingId(const std::string& name) {
  static std::mt19937_64 draw(std::random_device{}());
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  char suffix[20];
  std::snprintf(suffix, sizeof suffix, ".%016llx", static_cast<unsigned long long>(draw()));
  return name + suffix;
}

}  // namespace

bool isDialsUsEndpoint(const std::string& endpoint) { return endpoint == kDialsUsEndpoint; }

std::string acceptEndpointOf(const std::string& endpoint) {
  const std::string scheme = "tcp://";
  const auto colon = endpoint.rfind(':');
  if (endpoint.rfind(scheme, 0) != 0 || colon == std::string::npos || colon < scheme.size())
    return "";
  const std::string port = endpoint.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return "";
  const int p = std::stoi(port);
  if (p <= 0 || p >= 65535) return "";
  return endpoint.substr(0, colon + 1) + std::to_string(p + 1);
}

// ---------------------------------------------------------------- AcceptedLinks (reachable side)

AcceptedLinks::AcceptedLinks(zmq::context_t& context, std::string name, std::string bind_endpoint,
                             ReversedLinkOptions options)
    : context_(context),
      name_(std::move(name)),
      bind_endpoint_(std::move(bind_endpoint)),
      options_(options) {}

AcceptedLinks::~AcceptedLinks() { close(); }

void AcceptedLinks::bindLocked() {
  if (bind_endpoint_.empty())
    CAIRN_THROW(BadInput, name_, ": a dial-out-only peer must dial this node, but it has no accept "
                "endpoint (a node reached over tcp://HOST:PORT accepts at PORT+1)");
  zmq::socket_t router(context_, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);  // a full or missing peer: EAGAIN/EHOSTUNREACH
  router.set(zmq::sockopt::sndhwm, options_.send_high_water_mark);
  router.set(zmq::sockopt::rcvhwm, 16);
  // Only attaches come in; the limit holds the CURVE handshake's commands too (INITIATE with its
  // metadata is a few hundred bytes).
  router.set(zmq::sockopt::maxmsgsize, int64_t{1} << 16);
  setReversedHeartbeats(router, options_);
  if (options_.own) {
    router.set(zmq::sockopt::curve_server, true);
    router.set(zmq::sockopt::curve_secretkey, options_.own->secret_key);
    router.set(zmq::sockopt::zap_domain, "cairn");
  }
  if (options_.split_io_threads) router.set(zmq::sockopt::affinity, uint64_t{2});
  zmq::socket_t monitor = monitorSocket(context_, router, ZMQ_EVENT_DISCONNECTED, name_, "accept");
  try {
    bindRetryingWhileInUse(router, bind_endpoint_);
  } catch (const zmq::error_t& e) {
    zmq_socket_monitor(router.handle(), nullptr, 0);
    CAIRN_THROW(BadInput, name_, ": cannot accept dial-out-only peers on ", bind_endpoint_, ": ",
                e.what(), e.num() == EADDRINUSE ? " (another process uses this port)" : "");
  }
  bound_endpoint_ = router.get(zmq::sockopt::last_endpoint);
  router_ = std::move(router);
  monitor_ = std::move(monitor);
  CAIRN_DEBUG("accepting dial-out-only peers on ", bound_endpoint_);
}

void AcceptedLinks::add(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!router_) bindLocked();
  links_.emplace(peer, Link{});
}

void AcceptedLinks::reset(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(peer);
  if (it != links_.end()) it->second = Link{};
}

std::string AcceptedLinks::boundEndpoint() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bound_endpoint_;
}

bool AcceptedLinks::bound() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<bool>(router_);
}

AcceptedLinks::Queued AcceptedLinks::tryQueue(const std::string& peer,
                                              std::vector<zmq::message_t>& frames) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(peer);
  if (!router_ || it == links_.end() || it->second.liveness.state != PeerState::kConnected)
    return Queued::kNotAttached;
  const std::string& routing_id = it->second.routing_id;
  zmq::message_t id(routing_id.data(), routing_id.size());
  try {
    // ROUTER_MANDATORY: the routing-id frame fails with EAGAIN while the peer's queue is full
    // (cppzmq: no value) and EHOSTUNREACH when the peer has no connection (throws).
    if (!router_.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return Queued::kNoRoom;
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return Queued::kNotAttached;
    throw;
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    const auto more = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    const auto sent = router_.send(frames[i], more | zmq::send_flags::dontwait);
    CAIRN_ENFORCE(sent.has_value(), "ZeroMQ refused frame ", i, " of a message to ", peer);
  }
  return Queued::kSent;
}

// One attach (or other message) from the ROUTER, without waiting; false when none is queued.
bool AcceptedLinks::readAttachLocked(uint64_t* forged) {
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait))
    return false;
  // [routing id]["cairn-attach-1 NAME"]: NAME must be the name ZAP gave the connection's key.
  const std::string prefix = std::string(kAttachFrame) + " ";
  const std::string text = frames.size() == 2 ? frameText(frames[1]) : "";
  if (text.rfind(prefix, 0) != 0) return true;  // dropped
  const std::string peer = text.substr(prefix.size());
  auto it = links_.find(peer);
  if (it == links_.end()) return true;
  if (options_.own) {
    const char* user = zmq_msg_gets(frames[1].handle(), "User-Id");
    if (!user || peer != user) {
      ++*forged;
      CAIRN_WARN("dropped an attach naming \"", peer, "\" on the connection authenticated as \"",
                 user ? user : "", "\"");
      return true;
    }
  }
  Link& link = it->second;
  link.routing_id = frameText(frames[0]);
  link.fd = zmq_msg_get(frames[1].handle(), ZMQ_SRCFD);
  if (link.liveness.state != PeerState::kConnected) {
    link.liveness = {PeerState::kConnected, std::chrono::steady_clock::now()};
    CAIRN_DEBUG("connection from ", peer, " (dial-out only): connected");
  }
  return true;
}

bool AcceptedLinks::drain(uint64_t* forged) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!router_) return false;
  bool changed = false;
  // Closed connections first: an attach on a socket number just freed is newer than its close.
  uint16_t event = 0;
  uint32_t value = 0;
  while (readMonitorEvent(monitor_, &event, &value)) {
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
    for (auto& [peer, link] : links_) {
      if (link.fd != static_cast<int>(value) || link.liveness.state != PeerState::kConnected) continue;
      link.fd = -1;
      link.liveness = {PeerState::kDisconnected, std::chrono::steady_clock::now()};
      CAIRN_DEBUG("connection from ", peer, " (dial-out only): disconnected");
      changed = true;
    }
  }
  std::map<std::string, PeerState> before;
  for (const auto& [peer, link] : links_) before[peer] = link.liveness.state;
  while (readAttachLocked(forged)) {
  }
  for (const auto& [peer, link] : links_) changed |= before[peer] != link.liveness.state;
  return changed;
}

void AcceptedLinks::addPollItems(std::vector<zmq::pollitem_t>& items) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (monitor_) items.push_back({static_cast<void*>(monitor_), 0, ZMQ_POLLIN, 0});
}

PeerLiveness AcceptedLinks::liveness(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(peer);
  return it == links_.end() ? PeerLiveness{} : it->second.liveness;
}

void AcceptedLinks::close(std::chrono::milliseconds linger) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!router_) return;
  zmq_socket_monitor(router_.handle(), nullptr, 0);
  router_.set(zmq::sockopt::linger, static_cast<int>(linger.count()));
  router_.close();
  monitor_.close();
}

// ---------------------------------------------------------------- DialedLinks (dial-out-only side)

DialedLinks::DialedLinks(zmq::context_t& context, std::string name, ReversedLinkOptions options)
    : context_(context), name_(std::move(name)), options_(options) {}

DialedLinks::~DialedLinks() { close(); }

void DialedLinks::add(const std::string& peer, const std::string& accept_endpoint,
                      const std::string& server_key) {
  if (accept_endpoint.empty())
    CAIRN_THROW(BadInput, name_, ": peer ", peer, " has no accept endpoint to dial (tcp://HOST:PORT)");
  auto d = std::make_unique<Dialed>();
  d->socket = zmq::socket_t(context_, zmq::socket_type::dealer);
  d->socket.set(zmq::sockopt::routing_id, freshRoutingId(name_));
  d->socket.set(zmq::sockopt::rcvhwm, options_.receive_high_water_mark);
  d->socket.set(zmq::sockopt::sndhwm, 4);
  d->socket.set(zmq::sockopt::maxmsgsize, options_.max_inbound_bytes);
  d->socket.set(zmq::sockopt::reconnect_ivl, 100);
  d->socket.set(zmq::sockopt::reconnect_ivl_max, 1000);
  setReversedHeartbeats(d->socket, options_);
  if (options_.own) {
    d->socket.set(zmq::sockopt::curve_serverkey, server_key);
    d->socket.set(zmq::sockopt::curve_publickey, options_.own->public_key);
    d->socket.set(zmq::sockopt::curve_secretkey, options_.own->secret_key);
  }
  if (options_.split_io_threads) d->socket.set(zmq::sockopt::affinity, uint64_t{1});
  d->monitor = monitorSocket(
      context_, d->socket,
      ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED,
      name_, peer);
  try {
    allowIpv6For(d->socket, accept_endpoint);
    d->socket.connect(accept_endpoint);
  } catch (const zmq::error_t& e) {
    zmq_socket_monitor(d->socket.handle(), nullptr, 0);
    CAIRN_THROW(BadInput, name_, ": cannot dial peer ", peer, " at ", accept_endpoint, ": ", e.what());
  }
  d->endpoint = accept_endpoint;
  std::lock_guard<std::mutex> lock(mutex_);
  links_.emplace(peer, std::move(d));
}

void DialedLinks::repoint(const std::string& peer, const std::string& accept_endpoint,
                          const std::string& server_key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(peer);
  if (it == links_.end()) return;
  it->second->pending_endpoint = accept_endpoint;
  it->second->pending_key = server_key;
  it->second->pending = true;
}

void DialedLinks::remove(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(peer);
  if (it != links_.end()) it->second->removed = true;
}

void DialedLinks::drain() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Removed links are closed here, by the receiving thread, which polls their sockets otherwise.
  for (auto it = links_.begin(); it != links_.end();) {
    if (!it->second->removed) {
      ++it;
      continue;
    }
    zmq_socket_monitor(it->second->socket.handle(), nullptr, 0);
    it->second->socket.close();
    it->second->monitor.close();
    it = links_.erase(it);
    next_read_ = 0;  // an index into the map: the fair turns start again
  }
  for (auto& [peer, d] : links_) {
    const auto now = std::chrono::steady_clock::now();
    // The peer's ZAP refused our key (it does not admit us yet: a spare before its neighbours
    // took the new peers). ZeroMQ never dials again after that; we do, a little later.
    // A closed connection is dialled again by us, not by ZeroMQ, so that it has a new routing id.
    // What came over it and was not read yet (the peer's last messages before it closed: a Leaf's
    // eval_result to a dial-out-only Root) is kept first, since disconnect() drops what its pipe
    // holds; read() hands it out before anything newer. Kept once: while some of it is unread the
    // connection is not dialled again (no attach goes out on ZeroMQ's own reconnection, so the
    // peer sends nothing there), which bounds what is kept by the receive high-water mark.
    const bool closed = d->closed && d->kept.empty() && !d->pending;
    if (closed) {
      std::vector<zmq::message_t> frames;
      while (zmq::recv_multipart(d->socket, std::back_inserter(frames), zmq::recv_flags::dontwait))
        d->kept.push_back(std::exchange(frames, {}));
    }
    const bool redial = (d->refused && now - d->refused_at >= kRedialAfterRefusal) || closed;
    if (d->pending || redial) {
      d->refused = d->closed = d->connected = false;
      try {
        d->socket.disconnect(d->endpoint);  // may be gone already (ENOENT)
      } catch (const zmq::error_t&) {
      }
      if (d->pending) {  // another holder: what the replaced one sent is not handed out
        d->kept.clear();
        if (options_.own) d->socket.set(zmq::sockopt::curve_serverkey, d->pending_key);
        d->endpoint = d->pending_endpoint;
        d->pending = false;
      }
      d->socket.set(zmq::sockopt::routing_id, freshRoutingId(name_));
      allowIpv6For(d->socket, d->endpoint);
      d->socket.connect(d->endpoint);
    }
    uint16_t event = 0;
    uint32_t value = 0;
    while (readMonitorEvent(d->monitor, &event, &value)) {
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        d->refused = true;
        d->refused_at = now;
        CAIRN_DEBUG("dialling ", peer, " at ", d->endpoint, ": our key was refused; dialling again");
        continue;
      }
      if (event == ZMQ_EVENT_DISCONNECTED) {
        d->closed = d->connected;  // one that never completed a handshake: ZeroMQ retries it
        continue;
      }
      if (event != ZMQ_EVENT_HANDSHAKE_SUCCEEDED) continue;
      d->connected = true;
      d->attached_at = {};  // at once
      CAIRN_DEBUG("dialled ", peer, " at ", d->endpoint, ": connected");
    }
    // Each connection says who it is, at once and then every kReattach: the peer sends to us once
    // it heard it, and a peer that still held our routing id for a connection of ours that just
    // closed (its ROUTER ignores a second one until then) takes the next.
    if (d->connected && !d->closed && now - d->attached_at >= kReattach) {
      const std::string text = std::string(kAttachFrame) + " " + name_;
      zmq::message_t attach(text.data(), text.size());
      (void)d->socket.send(attach, zmq::send_flags::dontwait);
      d->attached_at = now;
    }
  }
}

void DialedLinks::addPollItems(std::vector<zmq::pollitem_t>& items) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [peer, d] : links_) {
    if (d->removed) continue;
    items.push_back({static_cast<void*>(d->socket), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(d->monitor), 0, ZMQ_POLLIN, 0});
  }
}

bool DialedLinks::read(std::vector<zmq::message_t>& frames, std::string* peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (links_.empty()) return false;
  const size_t n = links_.size();
  for (size_t i = 0; i < n; ++i) {
    auto it = std::next(links_.begin(), static_cast<long>((next_read_ + i) % n));
    if (it->second->removed) continue;
    std::deque<std::vector<zmq::message_t>>& kept = it->second->kept;
    if (!kept.empty()) {  // what came over a closed connection goes first
      frames = std::move(kept.front());
      kept.pop_front();
    } else if (!zmq::recv_multipart(it->second->socket, std::back_inserter(frames),
                                    zmq::recv_flags::dontwait)) {
      continue;
    }
    next_read_ = (next_read_ + i + 1) % n;
    *peer = it->first;
    return true;
  }
  return false;
}

void DialedLinks::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [peer, d] : links_) {
    zmq_socket_monitor(d->socket.handle(), nullptr, 0);
    d->socket.close();
    d->monitor.close();
  }
  links_.clear();
}

}  // namespace cairn
