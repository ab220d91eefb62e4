#include "node/transport/ZmqTransport.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <zmq_addon.hpp>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/ZmqSockets.h"

namespace cairn {
namespace {

void keepMessageMemory() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  });
}

// While reversed links are open, the receiving thread wakes at least this often: a new attach
// arrives on a ROUTER the senders share, so it is read between polls, not polled; a DEALER whose
// key was refused is dialled again from there (ReversedLinks.h).
constexpr std::chrono::milliseconds kReversedLinkPoll{20};

ReversedLinkOptions reversedLinkOptions(const TransportOptions& o, bool split_io_threads) {
  ReversedLinkOptions r;
  r.send_high_water_mark = o.send_high_water_mark;
  r.receive_high_water_mark = o.receive_high_water_mark;
  r.heartbeat_interval = o.heartbeat_interval;
  r.heartbeat_timeout = o.heartbeat_timeout;
  r.max_inbound_bytes = static_cast<int64_t>(o.codec.max_message_bytes + o.codec.max_header_bytes);
  r.own = o.curve ? &o.curve->own : nullptr;
  r.split_io_threads = split_io_threads;
  return r;
}

RelayedLinkOptions relayedLinkOptions(const TransportOptions& o, bool split_io_threads) {
  RelayedLinkOptions r;
  r.window = static_cast<size_t>(std::max(1, o.send_high_water_mark));
  r.receive_high_water_mark = o.receive_high_water_mark;
  r.heartbeat_interval = o.heartbeat_interval;
  r.heartbeat_timeout = o.heartbeat_timeout;
  // A relayed message: two small frames, then the header and tensors, each sealed (24 + 16 bytes).
  r.max_inbound_bytes = static_cast<int64_t>(o.codec.max_message_bytes + o.codec.max_header_bytes) +
                        (int64_t{1} << 20);
  r.split_io_threads = split_io_threads;
  r.resend_after = o.relay_resend_after;
  return r;
}

}  // namespace

ZmqTransport::ZmqTransport(zmq::context_t& context, std::string name,
                           const std::string& bind_endpoint, TransportOptions options)
    : context_(context),
      name_(std::move(name)),
      options_(options),
      inbound_(context, zmq::socket_type::pull) {
  if (options_.keep_message_memory) keepMessageMemory();
  inbound_.set(zmq::sockopt::rcvhwm, options_.receive_high_water_mark);
  inbound_.set(zmq::sockopt::linger, 0);
  // With two or more ZeroMQ I/O threads, incoming connections are read by the first and outgoing
  // ones written by the second, so that a node streaming both ways (a ring) copies in parallel.
  if (context_.get(zmq::ctxopt::io_threads) >= 2) inbound_.set(zmq::sockopt::affinity, uint64_t{1});
  // Header + all tensors; a little slack for the header frame.
  inbound_.set(zmq::sockopt::maxmsgsize,
               static_cast<int64_t>(options_.codec.max_message_bytes + options_.codec.max_header_bytes));
  if (options_.curve) {
    inbound_.set(zmq::sockopt::curve_server, true);
    inbound_.set(zmq::sockopt::curve_secretkey, options_.curve->own.secret_key);
    inbound_.set(zmq::sockopt::zap_domain, "cairn");
  }
  const bool split = context_.get(zmq::ctxopt::io_threads) >= 2;
  if (options_.dial_out_only)
    dialed_ = std::make_unique<DialedLinks>(context_, name_, reversedLinkOptions(options_, split));
  if (options_.curve)
    relayed_ = std::make_unique<RelayedLinks>(context_, name_, options_.curve->own,
                                              relayedLinkOptions(options_, split));
  if (bind_endpoint.empty()) {  // dial-out only: nothing to listen on
    CAIRN_ENFORCE(options_.dial_out_only, name_, ": no endpoint to listen on");
    return;
  }
  try {
    bindRetryingWhileInUse(inbound_, bind_endpoint);
    bound_endpoint_ = inbound_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    CAIRN_THROW(BadInput, name_, ": cannot listen on ", bind_endpoint, ": ", e.what(),
                e.num() == EADDRINUSE ? " (another process uses this port)" : "");
  }
  // Reversed links (ReversedLinks.h): a dial-out-only peer connects to PORT+1 of the endpoint
  // peers dial, unless the options name another.
  const std::string& dialled =
      options_.advertised_endpoint.empty() ? bound_endpoint_ : options_.advertised_endpoint;
  std::string accept = options_.accept_endpoint;
  if (accept.empty() && dialled == bound_endpoint_) accept = acceptEndpointOf(bound_endpoint_);
  accepted_ = std::make_unique<AcceptedLinks>(context_, name_, accept,
                                              reversedLinkOptions(options_, split));
  // Same-host links (header): the Unix-domain socket named after the port peers dial (normally
  // the TCP port this transport holds, so no two live transports of this user share it). ZeroMQ's
  // bind replaces a socket file left behind by a process that died; flushAndClose removes ours.
  const std::string& advertised =
      options_.advertised_endpoint.empty() ? bound_endpoint_ : options_.advertised_endpoint;
  same_host_endpoint_ = sameHostEndpointFor(advertised);
  if (!same_host_endpoint_.empty()) {
    same_host_inbound_ = zmq::socket_t(context_, zmq::socket_type::pull);
    same_host_inbound_.set(zmq::sockopt::rcvhwm, options_.receive_high_water_mark);
    same_host_inbound_.set(zmq::sockopt::linger, 0);
    if (context_.get(zmq::ctxopt::io_threads) >= 2)
      same_host_inbound_.set(zmq::sockopt::affinity, uint64_t{1});
    same_host_inbound_.set(zmq::sockopt::maxmsgsize,
                           static_cast<int64_t>(options_.codec.max_message_bytes +
                                                options_.codec.max_header_bytes));
    try {
      same_host_inbound_.bind(same_host_endpoint_);
    } catch (const zmq::error_t& e) {
      CAIRN_THROW(BadInput, name_, ": cannot listen on ", same_host_endpoint_,
                  " (the same-host socket of ", advertised, "): ", e.what());
    }
  }
}

std::string ZmqTransport::sameHostEndpointFor(const std::string& tcp_endpoint) const {
  return sameHostSocket(options_.same_host_dir, tcp_endpoint);
}

ZmqTransport::~ZmqTransport() {
  if (!closed_) flushAndClose(std::chrono::milliseconds(0));
  stopLinkKeeper();  // stopped already unless a peer was added after the close
}

ZmqTransport::Peer* ZmqTransport::findPeer(const std::string& peer) const {
  std::shared_lock<std::shared_mutex> lock(peers_mutex_);
  auto it = outbound_.find(peer);
  return it == outbound_.end() ? nullptr : const_cast<Peer*>(&it->second);
}

void ZmqTransport::addPeer(const std::string& peer, const std::string& endpoint,
                           const std::string& public_key) {
  CAIRN_ENFORCE(!closed_, "transport is closed");
  std::lock_guard<std::mutex> adding(add_mutex_);
  if (findPeer(peer)) return;
  if (options_.curve) {
    std::unique_lock<std::shared_mutex> lock(peers_mutex_);
    options_.curve->peer_public_keys[peer] = public_key;
  }
  addPeerLocked(peer, endpoint);
}

void ZmqTransport::addPeer(const std::string& peer, const std::string& endpoint) {
  CAIRN_ENFORCE(!closed_, "transport is closed");
  std::lock_guard<std::mutex> adding(add_mutex_);
  if (findPeer(peer)) return;
  addPeerLocked(peer, endpoint);
}

// Caller holds add_mutex_ (so the key map changes under nobody else) and found no such peer.
void ZmqTransport::addPeerLocked(const std::string& peer, const std::string& endpoint) {
  if (isDialsUsEndpoint(endpoint)) return addDialingPeerLocked(peer);
  if (isRelayedEndpoint(endpoint)) return addRelayedPeerLocked(peer, endpoint);
  zmq::socket_t socket(context_, zmq::socket_type::push);
  socket.set(zmq::sockopt::sndhwm, options_.send_high_water_mark);
  // Queue only on completed connections: a send to a peer that is not there yet waits (and times
  // out) instead of piling up in a pipe nobody reads.
  socket.set(zmq::sockopt::immediate, 1);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::reconnect_ivl, 100);
  socket.set(zmq::sockopt::reconnect_ivl_max, 1000);
  setZmtpHeartbeats(socket, options_.heartbeat_interval, options_.heartbeat_timeout);
  const std::string same_host = sameHostEndpointFor(endpoint);
  if (options_.curve && same_host.empty()) {
    auto key = options_.curve->peer_public_keys.find(peer);
    if (key == options_.curve->peer_public_keys.end())
      CAIRN_THROW(BadInput, name_, ": no CURVE public key for peer ", peer,
                  " (node.json must list it, or run with --insecure)");
    socket.set(zmq::sockopt::curve_serverkey, key->second);
    socket.set(zmq::sockopt::curve_publickey, options_.curve->own.public_key);
    socket.set(zmq::sockopt::curve_secretkey, options_.curve->own.secret_key);
  }
  if (context_.get(zmq::ctxopt::io_threads) >= 2) socket.set(zmq::sockopt::affinity, uint64_t{2});
  // The monitor is attached before connect() so no event is missed.
  zmq::socket_t monitor = monitorSocket(
      context_, socket,
      ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH,
      name_, peer);
  const std::string& dial = same_host.empty() ? endpoint : same_host;
  try {
    allowIpv6For(socket, dial);
    socket.connect(dial);
  } catch (const zmq::error_t& e) {
    zmq_socket_monitor(socket.handle(), nullptr, 0);
    CAIRN_THROW(BadInput, name_, ": cannot connect to peer ", peer, " at ", dial, ": ", e.what());
  }
  if (!same_host.empty()) CAIRN_DEBUG("peer ", peer, " (", endpoint, ") is on this host: ", same_host);
  Peer entry;
  entry.socket = std::move(socket);
  entry.monitor = std::move(monitor);
  entry.endpoint = dial;
  entry.same_host = !same_host.empty();
  // Dial-out only: the peer answers over a connection we open to its accept endpoint too, and the
  // link keeper says attach on it while the node receives nothing.
  if (dialed_) dialed_->add(peer, acceptEndpointOf(endpoint), curveKeyOf(peer));
  if (dialed_) startLinkKeeperLocked();
  std::unique_lock<std::shared_mutex> lock(peers_mutex_);
  outbound_.emplace(peer, std::move(entry));
}

bool ZmqTransport::drainMonitors() {
  bool changed = false;
  std::shared_lock<std::shared_mutex> peers(peers_mutex_);
  if (dialed_) dialed_->drain();
  if (relayed_) changed |= relayed_->drain();
  if (accepted_) {
    uint64_t forged = 0;
    changed = accepted_->drain(&forged);
    if (forged > 0) {
      std::lock_guard<std::mutex> lock(stats_mutex_);
      stats_.messages_forged += forged;
    }
  }
  for (auto& [peer, p] : outbound_) {
    if (p.accepted || p.relayed) continue;
    for (;;) {
      // A monitor event is two frames: 6 bytes (uint16 event, uint32 value), then the endpoint.
      std::vector<zmq::message_t> frames;
      auto got = zmq::recv_multipart(p.monitor, std::back_inserter(frames), zmq::recv_flags::dontwait);
      if (!got) break;
      if (frames.empty() || frames[0].size() < sizeof(uint16_t)) continue;
      uint16_t event = 0;
      std::memcpy(&event, frames[0].data(), sizeof(event));
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        // The peer's ZAP refused our key: ZeroMQ treats that as a protocol error and never dials
        // again by itself. The next send dials again (the peer may admit us by then).
        p.refused->store(true);
        CAIRN_DEBUG("connection to ", peer, ": our key was refused; dialling again on the next send");
        continue;
      }
      std::lock_guard<std::mutex> lock(liveness_mutex_);
      PeerState next = p.liveness.state;
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) next = PeerState::kConnected;
      // A connection that never completed a handshake (peer not up, wrong key) stays kUnknown.
      if (event == ZMQ_EVENT_DISCONNECTED && p.liveness.state == PeerState::kConnected)
        next = PeerState::kDisconnected;
      if (next != p.liveness.state) {
        p.liveness = {next, std::chrono::steady_clock::now()};
        CAIRN_DEBUG("connection to ", peer, ": ", toString(next));
        changed = true;
      }
    }
  }
  return changed;
}

std::optional<SendStatus> ZmqTransport::sendIfNotDialled(const std::string& peer, Peer& p,
                                                         std::vector<zmq::message_t>& frames,
                                                         std::chrono::milliseconds timeout) {
  bool accepted = false, relayed = false;
  {
    std::shared_lock<std::shared_mutex> peers(peers_mutex_);
    accepted = p.accepted;
    relayed = p.relayed;
  }
  if (accepted) return sendAccepted(peer, p, frames, timeout);
  if (relayed) return sendRelayed(peer, frames, timeout);
  return std::nullopt;
}

SendStatus ZmqTransport::send(const std::string& peer, const Message& message,
                              std::chrono::milliseconds timeout) {
  Peer* found = findPeer(peer);
  if (!found) return SendStatus::kUnknownPeer;
  std::vector<zmq::message_t> frames = encodeMessage(message, options_.codec);
  handOverFrames(frames);
  if (options_.pacer) {  // the volunteer's cap on what it sends: wait our turn
    uint64_t all = 0;
    for (const auto& f : frames) all += f.size();
    options_.pacer->take(all);
  }
  if (const auto other = sendIfNotDialled(peer, *found, frames, timeout)) return *other;
  {
    // The monitors belong to whoever receives; a send only reads them when nobody does (the
    // receiver drains them while it waits anyway).
    std::unique_lock<std::mutex> receiving(receive_mutex_, std::try_to_lock);
    if (receiving.owns_lock()) drainMonitors();
  }
  // The wait for room is cut into slices, the peer's send lock released between them, so a
  // re-pointing (repointPeer, from the thread applying a coordinator's `peers` update) never waits
  // behind a send to the peer's old, dead endpoint for the whole timeout: the send goes on to the
  // new endpoint in the next slice.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> sending(*found->send_mutex, std::defer_lock);
  for (;;) {
    while (found->repointing->load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    sending.lock();
    if (found->accepted || found->relayed) {  // turned meanwhile (repointPeer: turnDirectLink)
      sending.unlock();
      return *sendIfNotDialled(peer, *found, frames,
                               std::max(std::chrono::milliseconds(0),
                                        std::chrono::duration_cast<std::chrono::milliseconds>(
                                            deadline - std::chrono::steady_clock::now())));
    }
    if (found->refused->exchange(false)) {
      try {
        found->socket.disconnect(found->endpoint);  // may be gone already (ENOENT)
      } catch (const zmq::error_t&) {
      }
      allowIpv6For(found->socket, found->endpoint);
      found->socket.connect(found->endpoint);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (queueFirstFrame(found->socket, frames,
                        std::clamp(left, std::chrono::milliseconds(0), kSendSlice)))
      break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::lock_guard<std::mutex> lock(stats_mutex_);
      ++stats_.send_timeouts;
      return SendStatus::kTimedOut;
    }
    sending.unlock();
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(hook_mutex_);
      hook = send_wait_hook_;
    }
    if (hook) hook();
  }
  zmq::socket_t& socket = found->socket;
  uint64_t bytes = 0;
  for (size_t i = 1; i < frames.size(); ++i) {
    bytes += frames[i].size();
    const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    // Later frames of a multipart message never block: the first one reserved the room.
    auto sent = socket.send(frames[i], flags | zmq::send_flags::dontwait);
    CAIRN_ENFORCE(sent.has_value(), "ZeroMQ refused frame ", i, " of a multipart message");
  }
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.messages_sent;
  if (found->same_host) ++stats_.messages_sent_same_host;
  stats_.bytes_sent += bytes;
  return SendStatus::kSent;
}

std::optional<Message> ZmqTransport::receive(std::chrono::milliseconds timeout) {
  return receiveImpl(timeout, /*wake_on_liveness=*/false);
}

std::optional<Message> ZmqTransport::receiveOrLivenessChange(std::chrono::milliseconds timeout) {
  return receiveImpl(timeout, /*wake_on_liveness=*/true);
}

// A multipart message arrives whole, so once its first frame is readable all of it is. With a
// same-host socket too, the two are read first in turn, so neither starves the other.
bool ZmqTransport::readInbound(std::vector<zmq::message_t>& frames, bool* same_host,
                               std::string* dialed_peer) {
  dialed_peer->clear();
  if (relayed_ && relayed_->read(frames, dialed_peer)) {
    *same_host = false;
    return true;
  }
  if (dialed_ && dialed_->read(frames, dialed_peer)) {
    *same_host = false;
    return true;
  }
  std::optional<size_t> got;
  for (int i = 0; i < (same_host_inbound_ ? 2 : 1) && !got; ++i) {
    *same_host = same_host_inbound_ && (i == 0) == prefer_same_host_;
    got = zmq::recv_multipart(*same_host ? same_host_inbound_ : inbound_,
                              std::back_inserter(frames), zmq::recv_flags::dontwait);
  }
  prefer_same_host_ = !prefer_same_host_;
  return got.has_value();
}

std::optional<Message> ZmqTransport::receiveImpl(std::chrono::milliseconds timeout,
                                                 bool wake_on_liveness) {
  CAIRN_ENFORCE(!closed_, "transport is closed");
  std::lock_guard<std::mutex> receiving(receive_mutex_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // The PULL socket and every peer's monitor, polled together: a connection going down is seen
  // while waiting, not only at the next call.
  for (;;) {
    const bool changed = drainMonitors() | liveness_changed_.exchange(false);
    if (changed && wake_on_liveness) return std::nullopt;
    std::vector<zmq::message_t> frames;
    // Take what is queued without a poll first; poll (bounded by the deadline) only when empty.
    bool same_host = false;
    std::string dialed_peer;
    if (!readInbound(frames, &same_host, &dialed_peer)) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::milliseconds(0)) return std::nullopt;
      std::vector<zmq::pollitem_t> items = pollItems();
      if ((accepted_ && accepted_->bound()) || dialed_ || (relayed_ && relayed_->active()))
        left = std::min(left, kReversedLinkPoll);
      if (!pollOrInterrupted(items, left) && wake_on_liveness) return std::nullopt;
      continue;
    }
    takeOverFrames(frames);
    std::string authenticated;
    if (!dialed_peer.empty()) {
      authenticated = dialed_peer;  // our DEALER to that peer's key, or opened with its key (relayed)
    } else if (options_.curve && !same_host) {
      // The ZAP handler set the connection's User-Id to the peer's name.
      const char* user = zmq_msg_gets(frames[0].handle(), "User-Id");
      authenticated = user ? user : "";
    }
    DecodeResult decoded = decodeMessage(std::move(frames), options_.codec);
    if (decoded.ok() && (options_.curve || !dialed_peer.empty()) && !same_host &&
        decoded.message->sender != authenticated) {
      {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.messages_dropped;
        ++stats_.messages_forged;
      }
      CAIRN_WARN("dropped a message claiming to come from \"", decoded.message->sender,
                 "\" on the connection authenticated as \"", authenticated, "\"");
      continue;
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    if (decoded.ok()) {
      ++stats_.messages_received;
      if (same_host) ++stats_.messages_received_same_host;
      for (const auto& t : decoded.message->tensors) stats_.bytes_received += t.tensor.nbytes();
      return std::move(decoded.message);
    }
    ++stats_.messages_dropped;
    last_error_ = decoded.error;
    CAIRN_WARN("dropped a malformed message: ", toString(decoded.error->code), ": ",
               decoded.error->detail);
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
  }
}

void ZmqTransport::flushAndClose(std::chrono::milliseconds timeout) {
  if (closed_) return;
  stopLinkKeeper();
  flushRelayed(timeout);
  closed_ = true;
  if (accepted_) accepted_->close(timeout);  // like each PUSH socket below: what is queued leaves
  if (dialed_) dialed_->close();
  if (relayed_) relayed_->close();
  for (auto& [peer, p] : outbound_) {
    if (p.accepted || p.relayed) {
      p.monitor.close();  // a link turned from direct (turnDirectLink) kept it; none otherwise
      continue;
    }
    zmq_socket_monitor(p.socket.handle(), nullptr, 0);
    p.socket.set(zmq::sockopt::linger, static_cast<int>(timeout.count()));
    p.socket.close();
    p.monitor.close();
  }
  outbound_.clear();
  if (same_host_inbound_) {
    same_host_inbound_.close();
    // ZeroMQ leaves the socket file behind. Removed before the TCP port is given up, so a
    // transport that took the port over (and bound the same name) cannot lose its file to us.
    ::unlink(same_host_endpoint_.substr(std::strlen("ipc://")).c_str());
  }
  inbound_.close();
}

}  // namespace cairn
