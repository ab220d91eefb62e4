// ZmqTransport's reversed links (node/transport/ReversedLinks.h: peers that dial us because they
// are dial-out only, the sends to them) and relayed links (node/transport/RelayedLinks.h), each
// peer's liveness, what the receiving thread polls, and a peer's link moved or dialled again
// (repointPeer, redial). The rest of the class is in ZmqTransport.cpp.
#include <thread>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/ZmqSockets.h"
#include "node/transport/ZmqTransport.h"

namespace cairn {

std::string ZmqTransport::curveKeyOf(const std::string& peer) const {
  if (!options_.curve) return "";
  auto key = options_.curve->peer_public_keys.find(peer);
  if (key == options_.curve->peer_public_keys.end())
    CAIRN_THROW(BadInput, name_, ": no CURVE public key for peer ", peer,
                " (node.json must list it, or run with --insecure)");
  return key->second;
}

// A dial-out-only peer (endpoint kDialsUsEndpoint): no socket of ours dials it; it connects to
// our accept endpoint and we send through that (ReversedLinks.h).
void ZmqTransport::addDialingPeerLocked(const std::string& peer) {
  if (options_.dial_out_only || !accepted_)
    CAIRN_THROW(BadInput, name_, ": peer ", peer, " is dial-out only and so is this node",
                " (", bound_endpoint_.empty() ? "no address" : bound_endpoint_,
                "): neither can dial the other; such a link needs a relay");
  curveKeyOf(peer);  // checked: the peer's key must be known (ZAP admits it by it)
  accepted_->add(peer);
  Peer entry;
  entry.accepted = true;
  entry.endpoint = kDialsUsEndpoint;
  std::unique_lock<std::shared_mutex> lock(peers_mutex_);
  outbound_.emplace(peer, std::move(entry));
}

// A peer reached through a relay (RelayedLinks.h): sealed end to end with its key.
void ZmqTransport::addRelayedPeerLocked(const std::string& peer, const std::string& endpoint) {
  std::string relay_key, relay_endpoint;
  if (!parseRelayedEndpoint(endpoint, &relay_key, &relay_endpoint))
    CAIRN_THROW(BadInput, name_, ": peer ", peer, ": \"", endpoint, "\" is not a relayed endpoint (",
                kRelayedEndpointPrefix, "<the relay's 40-character key>@tcp://HOST:PORT)");
  if (!relayed_)
    CAIRN_THROW(BadInput, name_, ": peer ", peer, " is reached through a relay, which needs CURVE keys",
                " (a relayed link is sealed end to end with them): not with --insecure");
  relayed_->add(peer, relay_endpoint, relay_key, curveKeyOf(peer));
  startLinkKeeperLocked();
  Peer entry;
  entry.relayed = true;
  entry.endpoint = endpoint;
  std::unique_lock<std::shared_mutex> lock(peers_mutex_);
  outbound_.emplace(peer, std::move(entry));
}

TransportStats ZmqTransport::stats() const {
  TransportStats all;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    all = stats_;
  }
  if (relayed_) {
    const RelayedLinkStats relayed = relayed_->stats();
    all.relayed_refused = relayed.refused;
    all.relayed_resent = relayed.resent;
    all.messages_dropped += relayed.refused;
  }
  return all;
}

// Relayed links: what waits unacknowledged is sent again until it is acknowledged, so a transport
// closing waits (up to the flush timeout) for that, reading the acknowledgements meanwhile.
void ZmqTransport::flushRelayed(std::chrono::milliseconds timeout) {
  if (!relayed_) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!relayed_->allAcknowledged() && std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> receiving(receive_mutex_);
      drainMonitors();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// A relayed link is reliable only while its receiving side is drained: the acknowledgements the
// peer sends, its requests for what it lacks, what is due to be sent again (RelayedLinks.h) and
// the attaches to the relay are all handled there. A node's own thread drains it only while it
// receives or sends; one that computes, or waits on something else, would leave a message the
// relay dropped unsent again until then, and its peer waiting for it (CI saw a relayed ring peer
// dropped after 60 s: the last message a Root sent before a long wait was lost on the way). So
// this thread drains it whenever nobody else receives. What it opens waits for the next receive
// (bounded: RelayedLinksDrain.cpp kMaxOpenedWaiting); a liveness change it sees ends the next
// receiveOrLivenessChange at once. A dial-out-only node needs it as much: its DEALERs say
// `attach` after each handshake from this side (ReversedLinks.h), and a peer that restarted, or a
// connection that dropped, can send to it only once it has; without the keeper a node computing
// left its peer's sends waiting until it received again.
void ZmqTransport::startLinkKeeperLocked() {
  if (!link_keeper_.joinable()) link_keeper_ = std::thread([this] { keepLinks(); });
}

void ZmqTransport::keepLinks() {
  std::unique_lock<std::mutex> wait(keeper_mutex_);
  while (!keeper_wake_.wait_for(wait, kLinkKeeperInterval, [this] { return keeper_stop_; })) {
    wait.unlock();
    {
      std::unique_lock<std::mutex> receiving(receive_mutex_, std::try_to_lock);
      if (receiving.owns_lock() && drainMonitors()) liveness_changed_ = true;
    }
    wait.lock();
  }
}

void ZmqTransport::stopLinkKeeper() {
  {
    std::lock_guard<std::mutex> lock(keeper_mutex_);
    keeper_stop_ = true;
  }
  keeper_wake_.notify_all();
  if (link_keeper_.joinable()) link_keeper_.join();
}

void ZmqTransport::whileSendWaits() {
  {
    std::unique_lock<std::mutex> receiving(receive_mutex_, std::try_to_lock);
    if (receiving.owns_lock()) drainMonitors();
  }
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(hook_mutex_);
    hook = send_wait_hook_;
  }
  if (hook) hook();
}

SendStatus ZmqTransport::sendRelayed(const std::string& peer, std::vector<zmq::message_t>& frames,
                                     std::chrono::milliseconds timeout) {
  const SendStatus status = relayed_->send(peer, frames, timeout, [this] { whileSendWaits(); });
  uint64_t bytes = 0;
  for (size_t i = 1; i < frames.size(); ++i) bytes += frames[i].size();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  if (status == SendStatus::kSent) {
    ++stats_.messages_sent;
    stats_.bytes_sent += bytes;
  } else if (status == SendStatus::kTimedOut) {
    ++stats_.send_timeouts;
  }
  return status;
}

// To a dial-out-only peer: through our accept ROUTER, over the connection it opened and attached.
// The ROUTER cannot wait for one peer's room, so the wait is short sleeps between tries.
SendStatus ZmqTransport::sendAccepted(const std::string& peer, Peer& p,
                                      std::vector<zmq::message_t>& frames,
                                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto next_hook = std::chrono::steady_clock::now() + kSendSlice;
  for (;;) {
    {
      std::unique_lock<std::mutex> receiving(receive_mutex_, std::try_to_lock);
      if (receiving.owns_lock()) drainMonitors();
    }
    std::unique_lock<std::mutex> sending(*p.send_mutex);
    if (accepted_->tryQueue(peer, frames) == AcceptedLinks::Queued::kSent) break;
    sending.unlock();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      std::lock_guard<std::mutex> lock(stats_mutex_);
      ++stats_.send_timeouts;
      return SendStatus::kTimedOut;
    }
    if (now >= next_hook) {
      next_hook = now + kSendSlice;
      std::function<void()> hook;
      {
        std::lock_guard<std::mutex> lock(hook_mutex_);
        hook = send_wait_hook_;
      }
      if (hook) hook();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  uint64_t bytes = 0;
  for (size_t i = 1; i < frames.size(); ++i) bytes += frames[i].size();
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.messages_sent;
  stats_.bytes_sent += bytes;
  return SendStatus::kSent;
}

bool ZmqTransport::isSameHostPeer(const std::string& peer) const {
  const Peer* p = findPeer(peer);
  if (!p) return false;
  std::shared_lock<std::shared_mutex> peers(peers_mutex_);
  return p->same_host;
}

PeerLiveness ZmqTransport::liveness(const std::string& peer) const {
  const Peer* p = findPeer(peer);
  if (!p) return PeerLiveness{};
  bool accepted = false, relayed = false;
  {
    std::shared_lock<std::shared_mutex> peers(peers_mutex_);
    accepted = p->accepted;
    relayed = p->relayed;
  }
  if (accepted) return accepted_->liveness(peer);
  if (relayed) return relayed_->liveness(peer);
  std::lock_guard<std::mutex> lock(liveness_mutex_);
  return p->liveness;
}

// The inbound sockets and every monitor, polled together: a connection going down is seen while
// waiting, not only at the next call. Caller holds receive_mutex_.
std::vector<zmq::pollitem_t> ZmqTransport::pollItems() {
  std::vector<zmq::pollitem_t> items{{static_cast<void*>(inbound_), 0, ZMQ_POLLIN, 0}};
  if (same_host_inbound_) items.push_back({static_cast<void*>(same_host_inbound_), 0, ZMQ_POLLIN, 0});
  {
    std::shared_lock<std::shared_mutex> peers(peers_mutex_);
    for (auto& [peer, p] : outbound_)
      if (!p.accepted && !p.relayed) items.push_back({static_cast<void*>(p.monitor), 0, ZMQ_POLLIN, 0});
  }
  if (accepted_) accepted_->addPollItems(items);
  if (dialed_) dialed_->addPollItems(items);
  if (relayed_) relayed_->addPollItems(items);
  return items;
}

bool ZmqTransport::repointPeer(const std::string& peer, const std::string& endpoint,
                               const std::string& public_key) {
  CAIRN_ENFORCE(!closed_, "transport is closed");
  Peer* found = findPeer(peer);
  if (!found) return false;
  Peer& p = *found;
  bool was_accepted = false, was_relayed = false;
  {
    std::shared_lock<std::shared_mutex> peers(peers_mutex_);
    was_accepted = p.accepted;
    was_relayed = p.relayed;
  }
  // A peer we dialled whose node is now held dial-out only (coordinator/Replacement.h: a
  // dial-out-only spare took over a node placed reachable): it dials us from now on, or we meet
  // at a relay.
  if (!was_accepted && !was_relayed && (isDialsUsEndpoint(endpoint) || isRelayedEndpoint(endpoint)) &&
      turnDirectLink(peer, p, endpoint, public_key))
    return true;
  std::unique_lock<std::mutex> sending = lockForRepoint(p);
  if (p.relayed || isRelayedEndpoint(endpoint)) {
    std::string relay_key, relay_endpoint;
    if (!p.relayed || !parseRelayedEndpoint(endpoint, &relay_key, &relay_endpoint))
      CAIRN_THROW(BadInput, name_, ": peer ", peer, " changed from ",
                  p.relayed ? "relayed to unrelayed" : "dial-out only to relayed",
                  "; a node placed dial-out only stays so, whoever holds it");
    relayed_->repoint(peer, relay_endpoint, relay_key, public_key);
    return true;
  }
  if (p.accepted) {
    if (!isDialsUsEndpoint(endpoint))
      CAIRN_THROW(BadInput, name_, ": peer ", peer, " changed from dial-out only to reachable",
                  "; a node placed dial-out only stays so, whoever holds it");
    accepted_->reset(peer);  // the new holder dials us and attaches; its key is ZAP's business
    return true;
  }
  // A loopback address is reachable from this host only: a peer on this host stays on it (its
  // socket has no CURVE), one elsewhere stays elsewhere.
  const std::string same_host = sameHostEndpointFor(endpoint);
  if (same_host.empty() == p.same_host)
    CAIRN_THROW(BadInput, name_, ": peer ", peer, " moved ", p.same_host ? "off" : "onto",
                " this host (", endpoint, "); a peer on a loopback address stays on it");
  const std::string& dial = same_host.empty() ? endpoint : same_host;
  if (options_.curve && !p.same_host) p.socket.set(zmq::sockopt::curve_serverkey, public_key);
  reconnectLocked(peer, p, dial);
  if (dialed_) dialed_->repoint(peer, acceptEndpointOf(endpoint), public_key);
  return true;
}

// The PUSH socket is closed under the peer's send lock (a send that chose the direct way before
// the change finds the peer's new kind once it has the lock: send()); its monitor stays open and
// unpolled until flushAndClose, since a receive may be polling it at this moment. The kind
// changes under the send lock and the peers lock both, so either one is enough to read it.
bool ZmqTransport::turnDirectLink(const std::string& peer, Peer& p, const std::string& endpoint,
                                  const std::string& public_key) {
  std::lock_guard<std::mutex> adding(add_mutex_);  // one turn at a time: the kind is read again
  {
    std::shared_lock<std::shared_mutex> peers(peers_mutex_);
    if (p.accepted || p.relayed) return false;
  }
  const bool relayed = isRelayedEndpoint(endpoint);
  std::string relay_key, relay_endpoint;
  if (relayed && !parseRelayedEndpoint(endpoint, &relay_key, &relay_endpoint))
    CAIRN_THROW(BadInput, name_, ": peer ", peer, ": \"", endpoint, "\" is not a relayed endpoint (",
                kRelayedEndpointPrefix, "<the relay's 40-character key>@tcp://HOST:PORT)");
  if (relayed && !relayed_)
    CAIRN_THROW(BadInput, name_, ": peer ", peer, " is reached through a relay now, which needs CURVE",
                " keys (a relayed link is sealed end to end with them): not with --insecure");
  if (!relayed && (options_.dial_out_only || !accepted_))
    CAIRN_THROW(BadInput, name_, ": peer ", peer, " is dial-out only now and so is this node",
                ": neither can dial the other; such a link needs a relay");
  std::unique_lock<std::mutex> sending = lockForRepoint(p);
  if (options_.curve) {
    std::unique_lock<std::shared_mutex> lock(peers_mutex_);
    options_.curve->peer_public_keys[peer] = public_key;
  }
  if (relayed)
    relayed_->add(peer, relay_endpoint, relay_key, public_key);
  else
    accepted_->add(peer);
  if (dialed_) dialed_->remove(peer);
  zmq_socket_monitor(p.socket.handle(), nullptr, 0);
  p.socket.set(zmq::sockopt::linger, 0);  // what waits in it was for the lost holder
  p.socket.close();
  {
    std::unique_lock<std::shared_mutex> lock(peers_mutex_);
    p.accepted = !relayed;
    p.relayed = relayed;
    p.same_host = false;
    p.endpoint = endpoint;
  }
  if (relayed) startLinkKeeperLocked();
  CAIRN_DEBUG("peer ", peer, ": its node is held dial-out only now: ",
              relayed ? "reached through the relay at " + relay_endpoint : std::string("it dials us"));
  return true;
}

void ZmqTransport::redial(const std::string& peer) {
  if (closed_) return;
  Peer* found = findPeer(peer);
  if (!found) return;
  std::unique_lock<std::mutex> sending = lockForRepoint(*found);
  if (found->relayed) return;  // relayed: acknowledged and sent again (RelayedLinks.h)
  if (found->accepted) {
    // A dial-out-only peer: its attached connection may be its old process's; the next send
    // waits for an attach, which its DEALER says once a second (ReversedLinks.h).
    accepted_->reset(peer);
    CAIRN_DEBUG("peer ", peer, ": waiting for its next attach (its process may have restarted)");
    return;
  }
  reconnectLocked(peer, *found, found->endpoint);
  CAIRN_DEBUG("peer ", peer, ": dialled ", found->endpoint, " again (its process may have restarted)");
}

std::unique_lock<std::mutex> ZmqTransport::lockForRepoint(Peer& p) {
  p.repointing->fetch_add(1);
  std::unique_lock<std::mutex> sending(*p.send_mutex);
  p.repointing->fetch_sub(1);
  return sending;
}

void ZmqTransport::reconnectLocked(const std::string& peer, Peer& p, const std::string& dial) {
  try {
    p.socket.disconnect(p.endpoint);  // may be gone already (ENOENT)
  } catch (const zmq::error_t&) {
  }
  // disconnect() only asks the I/O thread to end the old session; its pipe stays attached (and a
  // send right away is written into it and dropped with it: seen in
  // PeerRepoint.ARedialledPeerGetsTheNextMessageOverANewConnection) until the socket has taken the
  // pipe's termination. ZMQ_EVENTS processes the socket's commands: once no pipe takes a message,
  // the old one is gone, and the next message can only go over the connection dialled below. (A
  // pipe full at its high-water mark reads as gone early; at a redial it could only hold what was
  // meant for the peer's old process, which nothing answers any more.)
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while ((p.socket.get(zmq::sockopt::events) & ZMQ_POLLOUT) != 0) {
    if (std::chrono::steady_clock::now() >= until) {
      CAIRN_WARN(name_, ": the old connection to ", peer, " did not end within 2 s; dialling anyway");
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  try {
    allowIpv6For(p.socket, dial);
    p.socket.connect(dial);
  } catch (const zmq::error_t& e) {
    CAIRN_THROW(BadInput, name_, ": cannot connect to peer ", peer, " at ", dial, ": ", e.what());
  }
  p.endpoint = dial;
  p.refused->store(false);
}

}  // namespace cairn
