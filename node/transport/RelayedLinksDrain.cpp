// RelayedLinks' receiving side (node/transport/RelayedLinks.h): connections to the relays,
// attaches, presence, opening what arrives, acknowledgements and resends. The senders' side is in
// RelayedLinks.cpp.
#include <algorithm>
#include <cstring>

#include <zmq_addon.hpp>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/RelayedLinks.h"
#include "node/transport/RelayedLinksState.h"
#include "node/transport/ZmqSockets.h"

namespace cairn {
namespace {

constexpr std::chrono::milliseconds kReattach{1000};
constexpr std::chrono::milliseconds kRedialAfterRefusal{200};
// How long a relay may not name a peer after the link moved to it, or after our connection to it
// was made again, before the peer counts as disconnected (setPresence).
constexpr std::chrono::milliseconds kRelayPeerGrace{10000};
constexpr std::chrono::milliseconds kAskAgainAfter{200};
constexpr size_t kMaxReadsPerDrain = 256;
// Opened messages waiting for read(): past this many a drain leaves the rest in the receiving
// DEALER (unopened, unacknowledged), so a node whose transport is kept drained while it reads
// nothing (ZmqTransport's link keeper) still holds its peers back through their windows.
constexpr size_t kMaxOpenedWaiting = 64;

std::string text(const zmq::message_t& frame) {
  return std::string(static_cast<const char*>(frame.data()), frame.size());
}

std::string controlPayload(char kind, uint64_t session, uint64_t next) {
  std::string out(17, '\0');
  out[0] = kind;
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<char>((session >> (8 * i)) & 0xff);
  for (int i = 0; i < 8; ++i) out[9 + i] = static_cast<char>((next >> (8 * i)) & 0xff);
  return out;
}

bool parseControl(const std::string& payload, char* kind, uint64_t* session, uint64_t* next) {
  if (payload.size() != 17 || (payload[0] != 'a' && payload[0] != 'r')) return false;
  *kind = payload[0];
  *session = *next = 0;
  for (int i = 7; i >= 0; --i) *session = (*session << 8) | static_cast<uint8_t>(payload[1 + i]);
  for (int i = 7; i >= 0; --i) *next = (*next << 8) | static_cast<uint8_t>(payload[9 + i]);
  return true;
}

// Dials again a socket whose key the relay refused (it did not list us yet): ZeroMQ gives such a
// connection up for good.
void redial(zmq::socket_t& socket, const std::string& endpoint) {
  try {
    socket.disconnect(endpoint);
  } catch (const zmq::error_t&) {
  }
  allowIpv6For(socket, endpoint);
  socket.connect(endpoint);
}

}  // namespace

bool RelayedLinks::drain() {
  const auto now = std::chrono::steady_clock::now();
  bool changed = false;
  std::vector<Connection*> connections;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, c] : connections_) connections.push_back(c.get());
    for (auto& [peer, link] : links_) {  // a repoint to another volunteer (RelayedLinks::repoint)
      if (link->receiver_key.empty()) continue;
      link->opener = LinkOpener(own_, link->receiver_key);
      link->control_out = ControlSealer(own_, link->receiver_key);
      link->control_in = ControlOpener(own_, link->receiver_key);
      link->ack_due = false;
      link->receiver_key.clear();
    }
  }
  for (Connection* c : connections) changed |= drainConnection(*c, now);
  // Acknowledge what was opened, on the receiving DEALER (this thread's).
  std::vector<std::pair<std::string, Link*>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [peer, link] : links_)
      if (link->ack_due) due.emplace_back(peer, link.get());
  }
  for (auto& [peer, link] : due) {
    link->ack_due = false;
    acknowledge(*link->connection, peer, *link, 'a', link->opener.expectedSession(),
                link->opener.expectedSequence());
  }
  resendDue(now);
  return changed;
}

bool RelayedLinks::drainConnection(Connection& c, std::chrono::steady_clock::time_point now) {
  bool changed = false;
  uint16_t event = 0;
  uint32_t value = 0;
  while (readMonitorEvent(c.receive_monitor, &event, &value)) {
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      c.refused = true;
      c.refused_at = now;
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      c.connected = true;
      c.attached_at = {};  // attach at once
    } else if (event == ZMQ_EVENT_DISCONNECTED && c.connected) {
      c.connected = false;
      relayLost(c, now);
    }
  }
  bool send_reconnected = false;
  while (readMonitorEvent(c.send_monitor, &event, &value)) {
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      c.send_refused = true;
      c.send_refused_at = now;
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      send_reconnected = true;  // what the last connection held may be lost: send it again
      c.send_up = true;
    } else if (event == ZMQ_EVENT_DISCONNECTED && c.send_up) {
      // The sending DEALER's heartbeats went unanswered or the relay closed it: the relay is gone
      // (the receiving DEALER, without heartbeats, may not know yet). Its peers are down, and the
      // receiving DEALER dials again now, to attach as soon as the relay is back.
      c.send_up = false;
      if (c.connected) {
        c.connected = false;
        redial(c.receive_socket, c.endpoint);
      }
      relayLost(c, now);
    }
  }
  if (c.refused && now - c.refused_at >= kRedialAfterRefusal) {
    c.refused = false;
    redial(c.receive_socket, c.endpoint);
  }
  if (c.send_refused && now - c.send_refused_at >= kRedialAfterRefusal) {
    std::lock_guard<std::mutex> sending(c.send_mutex);
    c.send_refused = false;
    redial(c.send_socket, c.endpoint);
  }
  if (c.connected && now - c.attached_at >= kReattach) {
    zmq::message_t kind("A", 1);
    zmq::message_t name(name_.data(), name_.size());
    if (c.receive_socket.send(kind, zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      (void)c.receive_socket.send(name, zmq::send_flags::dontwait);
    c.attached_at = now;
  }
  for (size_t n = 0; n < kMaxReadsPerDrain && opened_.size() < kMaxOpenedWaiting; ++n) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(c.receive_socket, std::back_inserter(frames), zmq::recv_flags::dontwait))
      break;
    takeOverFrames(frames);
    if (frames.empty() || frames[0].size() != 1) continue;
    const char kind = *static_cast<const char*>(frames[0].data());
    if (kind == 'P') {
      std::vector<std::string> present;
      for (size_t i = 1; i < frames.size(); ++i) present.push_back(text(frames[i]));
      changed |= setPresence(c, present, now);
    } else if (kind == 'D' && frames.size() >= 3) {
      takeData(c, frames);
    }
  }
  if (send_reconnected) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [peer, link] : links_) {
      if (link->connection != &c) continue;
      std::lock_guard<std::mutex> state(link->state);
      if (!link->unacked.empty()) link->resend_from = link->unacked.front().first;
    }
  }
  return changed;
}

// Our connection to relay `c` is gone (the relay died, or the path to it): that says nothing of
// the peers behind it, which keep their liveness — the link waits, as on a slow link, until the
// relay is back or the coordinator moves the link to another relay (repoint) — and each peer is
// waited for anew at the relay's next presence (kRelayPeerGrace).
void RelayedLinks::relayLost(Connection& c, std::chrono::steady_clock::time_point now) {
  c.present.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [peer, link] : links_) {
    if (link->connection != &c) continue;
    link->seen_here = false;
    link->here_since = now;
  }
}

// A presence of relay `c`: a peer it names is connected; one it no longer names after it did has
// left the relay (its process or its connection is gone): disconnected; one it has not named since
// the link moved there (or since our connection to it was made again) is given kRelayPeerGrace to
// come (it hears of the new relay at its own next heartbeat) before it counts as disconnected.
bool RelayedLinks::setPresence(Connection& c, const std::vector<std::string>& present,
                               std::chrono::steady_clock::time_point now) {
  c.present = std::set<std::string>(present.begin(), present.end());
  bool changed = false;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [peer, link] : links_) {
    if (link->connection != &c) continue;
    const bool up = c.connected && c.present.count(peer) > 0;
    const bool gone = link->seen_here || now - link->here_since >= kRelayPeerGrace;
    link->seen_here = up;
    if (!up && !gone) continue;  // not come yet: within its grace
    PeerState next = link->liveness.state;
    if (up) next = PeerState::kConnected;
    else if (link->liveness.state == PeerState::kConnected) next = PeerState::kDisconnected;
    if (next == link->liveness.state) continue;
    link->liveness = {next, now};
    CAIRN_DEBUG("relayed link to ", peer, " through ", c.endpoint, ": ", toString(next));
    changed = true;
  }
  return changed;
}

// ["D", FROM, sealed…]: a data message or (one sealed control frame) an acknowledgement or a
// request to resend.
void RelayedLinks::takeData(Connection& c, std::vector<zmq::message_t>& frames) {
  const std::string peer = text(frames[1]);
  Link* link = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = links_.find(peer);
    if (it != links_.end() && it->second->connection == &c) link = it->second.get();
  }
  if (!link) {
    CAIRN_DEBUG(name_, ": dropped a relayed message from ", peer, ", not relayed through ", c.endpoint);
    return;
  }
  std::vector<zmq::message_t> sealed;
  for (size_t i = 2; i < frames.size(); ++i) sealed.push_back(std::move(frames[i]));
  std::string why;
  if (sealed.size() == 1 && isSealedControl(sealed[0])) {
    std::string payload;
    if (link->control_in.open(sealed[0], &payload, &why)) takeControl(*link, peer, payload);
    else CAIRN_DEBUG(name_, ": refused a control message from ", peer, ": ", why);
    return;
  }
  uint64_t session = 0, sequence = 0;
  const bool peeked = peekSealed(sealed[0], &session, &sequence);
  const LinkOpener::Opened opened = link->opener.open(sealed, &why);
  if (opened == LinkOpener::Opened::kOpened) {
    link->ack_due = true;
    opened_.emplace_back(peer, std::move(sealed));
    return;
  }
  if (opened == LinkOpener::Opened::kReplayed) {  // a duplicate: say again what we hold
    link->ack_due = true;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.refused;
  }
  // From a session we never saw (the peer restarted): from its start; else from what we lack.
  uint64_t ask_session = link->opener.expectedSession(), ask_next = link->opener.expectedSequence();
  if (peeked && session != ask_session && !link->opener.knowsSession(session)) {
    ask_session = session;
    ask_next = 0;
  }
  const auto now = std::chrono::steady_clock::now();
  if (ask_session == link->asked_session && ask_next == link->asked_next &&
      now - link->asked_at < kAskAgainAfter)
    return;
  link->asked_session = ask_session;
  link->asked_next = ask_next;
  link->asked_at = now;
  CAIRN_WARN(name_, ": refused a message relayed from ", peer, " (", openedName(opened), "): ", why,
             opened == LinkOpener::Opened::kForged
                 ? " (Also seen for a moment when the peer's volunteer was replaced and this node "
                   "does not have its new key yet.)"
                 : "",
             " Asking for it again.");
  acknowledge(c, peer, *link, 'r', ask_session, ask_next);
}

// The peer acknowledged (`a`) or asked for what it lacks (`r`), naming one of our sessions.
void RelayedLinks::takeControl(Link& link, const std::string& peer, const std::string& payload) {
  char kind = 0;
  uint64_t session = 0, next = 0;
  if (!parseControl(payload, &kind, &session, &next)) return;
  std::lock_guard<std::mutex> state(link.state);
  if (session != link.sealer.session()) return;  // about a session of ours that is over
  const uint64_t sent = link.next_sequence;
  if (next > sent) return;  // it cannot hold what we never sent: ignored
  const size_t before = link.unacked.size();
  while (!link.unacked.empty() && link.unacked.front().first < next) {
    for (const auto& f : link.unacked.front().second) link.unacked_bytes -= f.size();
    link.unacked.pop_front();
  }
  if (link.unacked.size() != before) {
    link.progress_at = std::chrono::steady_clock::now();
    link.silent_resends = 0;
    link.room.notify_all();  // a sender waiting for the window
  }
  if (kind == 'a' || next == sent) return;
  if (link.unacked.empty() || link.unacked.front().first > next) {
    // It asks from a point we no longer hold: it lost what it had acknowledged (it restarted).
    // A new session, and what it has not acknowledged goes to it again from sequence 0.
    link.sealer.restart();
    link.next_sequence = 0;
    link.unacked_bytes = 0;
    for (auto& [sequence, frames] : link.unacked) {
      sequence = link.next_sequence++;
      frames = link.sealer.resealAt(frames, sequence);
      for (const auto& f : frames) link.unacked_bytes += f.size();
    }
    link.silent_resends = 0;
    if (!link.unacked.empty()) link.resend_from = 0;
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.sessions_restarted;
    CAIRN_INFO(name_, ": ", peer, " asked for what it had acknowledged (it restarted): a new session");
    return;
  }
  link.resend_from = next;
}

// A sealed control message to `peer`, on the receiving DEALER (this thread's), never waiting.
void RelayedLinks::acknowledge(Connection& c, const std::string& peer, Link& link, char kind,
                               uint64_t session, uint64_t next) {
  zmq::message_t sealed = link.control_out.seal(controlPayload(kind, session, next));
  zmq::message_t d("D", 1);
  zmq::message_t to(peer.data(), peer.size());
  if (!c.receive_socket.send(d, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
  (void)c.receive_socket.send(to, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)c.receive_socket.send(sealed, zmq::send_flags::dontwait);
}

// How long what waits unacknowledged is left before it is sent again (RelayedLinkOptions::
// resend_after).
std::chrono::milliseconds RelayedLinks::silence(uint64_t bytes, int resends) const {
  const auto base = options_.resend_after + std::chrono::milliseconds(bytes / 1000);
  return base * (int64_t{1} << std::min(resends, 6));
}

// Sends again what a peer asked for, what a new connection may have lost, and what waited too
// long without an acknowledgement; as much as the relay's queue takes now.
void RelayedLinks::resendDue(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::string, Link*>> links;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [peer, link] : links_) links.emplace_back(peer, link.get());
  }
  for (auto& [peer, link] : links) {
    Connection* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      c = link->connection;
    }
    std::lock_guard<std::mutex> state(link->state);
    if (!link->resend_from && !link->unacked.empty() &&
        now - link->progress_at >= silence(link->unacked_bytes, link->silent_resends)) {
      link->resend_from = link->unacked.front().first;
      link->progress_at = now;
      ++link->silent_resends;
    }
    if (!link->resend_from) continue;
    uint64_t resent = 0;
    for (auto& [sequence, kept] : link->unacked) {
      if (sequence < *link->resend_from) continue;
      std::vector<zmq::message_t> copy = shareFrames(kept);
      if (!queueSealed(*c, peer, copy)) break;
      link->resend_from = sequence + 1;
      ++resent;
    }
    if (link->unacked.empty() || *link->resend_from > link->unacked.back().first) {
      link->resend_from.reset();
      link->room.notify_all();  // senders wait while a resend is pending
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.resent += resent;
  }
}

void RelayedLinks::addPollItems(std::vector<zmq::pollitem_t>& items) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, c] : connections_) {
    items.push_back({static_cast<void*>(c->receive_socket), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(c->receive_monitor), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(c->send_monitor), 0, ZMQ_POLLIN, 0});
  }
}

bool RelayedLinks::read(std::vector<zmq::message_t>& frames, std::string* peer) {
  if (opened_.empty()) return false;
  *peer = std::move(opened_.front().first);
  frames = std::move(opened_.front().second);
  opened_.pop_front();
  return true;
}

PeerLiveness RelayedLinks::liveness(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = links_.find(peer);
  return it == links_.end() ? PeerLiveness{} : it->second->liveness;
}

RelayedLinkStats RelayedLinks::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void RelayedLinks::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, c] : connections_) {
    std::lock_guard<std::mutex> sending(c->send_mutex);
    zmq_socket_monitor(c->send_socket.handle(), nullptr, 0);
    zmq_socket_monitor(c->receive_socket.handle(), nullptr, 0);
    c->send_socket.close();
    c->receive_socket.close();
    c->send_monitor.close();
    c->receive_monitor.close();
  }
  connections_.clear();
  links_.clear();
  opened_.clear();
}

}  // namespace cairn
