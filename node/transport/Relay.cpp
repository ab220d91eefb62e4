// The relay (Relay.h): the Relay object (its context, ZAP handler, ROUTER and thread) and the
// loop's reading side: messages, attaches, presence, closed connections, setLinks.
// Forwarding and the per-link queues: RelayQueues.cpp.
#include "node/transport/Relay.h"

#include <algorithm>
#include <cerrno>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/RelayLoop.h"
#include "node/transport/ZmqSockets.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

// Messages read per turn of the loop before it looks at its queues, links and stop flag again.
constexpr int kRelayReadsPerTurn = 256;

}  // namespace

void setRelayKeepalive(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::tcp_keepalive, 1);
  socket.set(zmq::sockopt::tcp_keepalive_idle, 5);   // seconds of silence before the first probe
  socket.set(zmq::sockopt::tcp_keepalive_intvl, 1);  // then one a second
  socket.set(zmq::sockopt::tcp_keepalive_cnt, 5);    // five unanswered: the connection is gone
}

namespace {

zmq::socket_t relayRouter(zmq::context_t& context, const RelayOptions& o) {
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::router_mandatory, 1);  // a full or missing client: EAGAIN/EHOSTUNREACH
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::sndhwm, o.send_high_water_mark);
  router.set(zmq::sockopt::rcvhwm, o.receive_high_water_mark);
  // Per frame, the CURVE handshake's commands included (INITIATE with its metadata: a few
  // hundred bytes), hence the floor.
  router.set(zmq::sockopt::maxmsgsize,
             o.max_message_bytes > 0 ? std::max<int64_t>(o.max_message_bytes, 4096) : int64_t{-1});
  // A client that vanished is noticed by TCP keepalives (answered by its kernel whatever its
  // process reads), not by ZMTP heartbeats: a client whose inbound pipe is full (a slow reader)
  // stops reading its TCP stream and so never sees a PING behind the data, and libzmq then closes a
  // healthy connection — and may abort at the client's reconnect (libzmq issue 3937, seen here:
  // `Assertion failed: _input_stopped`). Heartbeats only when asked (heartbeat_interval > 0).
  setRelayKeepalive(router);
  setZmtpHeartbeats(router, o.heartbeat_interval, o.heartbeat_timeout);
  router.set(zmq::sockopt::curve_server, true);
  router.set(zmq::sockopt::curve_secretkey, o.own.secret_key);
  router.set(zmq::sockopt::zap_domain, kRelayZapDomain);
  return router;
}

}  // namespace

// ---------------------------------------------------------------- Relay

Relay::Relay(RelayOptions options) : options_(std::move(options)) {
  if (!isZ85Key(options_.own.public_key) || !isZ85Key(options_.own.secret_key))
    CAIRN_THROW(BadInput, "relay on ", options_.bind_endpoint, ": its CURVE keys are not Z85 keys");
  CAIRN_ENFORCE(options_.max_payload_frames >= 1 && options_.link_budget_bytes >= 0,
                "relay: max_payload_frames must be at least 1 and link_budget_bytes not negative");
  context_ = std::make_unique<zmq::context_t>();
  // Before the ROUTER binds: no connection is ever judged without it. Admits nobody yet.
  zap_ = std::make_unique<ZapAuthenticator>(*context_, std::map<std::string, std::string>{});
  zmq::socket_t router = relayRouter(*context_, options_);
  zmq::socket_t monitor =
      monitorSocket(*context_, router, ZMQ_EVENT_DISCONNECTED, "relay", "router");
  try {
    bindRetryingWhileInUse(router, options_.bind_endpoint);
  } catch (const zmq::error_t& e) {
    zmq_socket_monitor(router.handle(), nullptr, 0);
    CAIRN_THROW(BadInput, "relay: cannot bind ", options_.bind_endpoint, ": ", e.what(),
                e.num() == EADDRINUSE ? " (another process uses this port)" : "");
  }
  bound_endpoint_ = router.get(zmq::sockopt::last_endpoint);
  loop_ = std::make_unique<RelayLoop>(options_, std::move(router), std::move(monitor));
  thread_ = std::thread([this] { loop_->run(stop_); });
  CAIRN_INFO("relaying on ", bound_endpoint_);
}

Relay::~Relay() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  loop_.reset();  // its sockets, before the ZAP handler and the context
  zap_.reset();
  context_.reset();
}

void Relay::setLinks(std::map<std::string, std::string> members,
                     std::set<std::pair<std::string, std::string>> pairs) {
  std::map<std::string, std::string> allowed;  // key → User-Id "NAME KEY"
  for (const auto& [name, key] : members) {
    if (!isZ85Key(key)) CAIRN_THROW(BadInput, "relay: member ", name, " has no Z85 key: ", key);
    allowed[key] = name + " " + key;
  }
  // The loop first: a connection the new ZAP list admits never meets the old members.
  loop_->setLinks(std::move(members), std::move(pairs));
  zap_->setAllowed(std::move(allowed));
}

std::string Relay::boundEndpoint() const { return bound_endpoint_; }

RelayStats Relay::stats() const {
  RelayStats stats = loop_->stats();
  stats.refused_keys = zap_->rejected();
  return stats;
}

// ---------------------------------------------------------------- RelayLoop: reading

RelayLoop::RelayLoop(const RelayOptions& options, zmq::socket_t router, zmq::socket_t monitor)
    : options_(options),
      router_(std::move(router)),
      monitor_(std::move(monitor)),
      // The burst of `provider --max-mbps` (VolunteerRun.cpp): 256 KiB, or 0.1 s at the rate.
      pacer_(options.max_mbps > 0
                 ? std::make_unique<SendPacer>(
                       options.max_mbps,
                       std::max<uint64_t>(256 << 10, uint64_t(options.max_mbps * 1e6 / 8 * 0.1)))
                 : nullptr) {}

RelayLoop::~RelayLoop() {
  zmq_socket_monitor(router_.handle(), nullptr, 0);
  router_.close();
  monitor_.close();
}

void RelayLoop::run(const std::atomic<bool>& stop) {
  while (!stop) {
    try {
      applyPendingLinks();
      const auto retry = serviceQueues(Clock::now());  // when something waits: how soon
      std::vector<zmq::pollitem_t> items{{static_cast<void*>(router_), 0, ZMQ_POLLIN, 0},
                                         {static_cast<void*>(monitor_), 0, ZMQ_POLLIN, 0}};
      const auto wait = retry ? std::chrono::ceil<std::chrono::milliseconds>(*retry) : kRelayIdlePoll;
      count(&RelayStats::loop_turns);
      if (!pollOrInterrupted(items, wait)) continue;
      drainMonitor();
      for (int i = 0; i < kRelayReadsPerTurn && readOne(); ++i) {
      }
      dropQueues(&RelayLoop::unattachedTooLong, Clock::now());
    } catch (const std::exception& e) {
      // Nothing a client sends gets here; a fault of ZeroMQ itself: say so and keep relaying.
      CAIRN_ERROR("relay: ", e.what());
      std::this_thread::sleep_for(20ms);
    }
  }
}

void RelayLoop::setLinks(std::map<std::string, std::string> members, std::set<Link> pairs) {
  std::lock_guard<std::mutex> lock(pending_mutex_);
  pending_members_ = std::move(members);
  pending_pairs_ = std::move(pairs);
  links_pending_ = true;
}

RelayStats RelayLoop::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

void RelayLoop::count(uint64_t RelayStats::*counter, uint64_t n) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  stats_.*counter += n;
}

void RelayLoop::applyPendingLinks() {
  if (!links_pending_.load()) return;
  std::map<std::string, std::string> members;
  std::set<Link> pairs;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    members = std::move(pending_members_);
    pairs = std::move(pending_pairs_);
    links_pending_ = false;
  }
  const auto now = Clock::now();
  // A member listed again with the same key keeps its connection; any other starts unattached.
  std::map<std::string, Member> next;
  for (auto& [name, key] : members) {
    auto it = members_.find(name);
    if (it != members_.end() && it->second.key == key) {
      next.emplace(name, std::move(it->second));
      continue;
    }
    Member member;
    member.key = key;
    member.unattached_since = now;
    next.emplace(name, std::move(member));
  }
  members_ = std::move(next);
  pairs_.clear();
  for (auto [a, b] : pairs) {
    if (b < a) std::swap(a, b);
    if (members_.count(a) && members_.count(b)) pairs_.insert({a, b});
  }
  dropQueues(&RelayLoop::noLongerPlanned, now);
  for (const auto& [name, member] : members_) sendPresence(name);  // the pairs may have changed
  CAIRN_DEBUG("relay: ", members_.size(), " members, ", pairs_.size(), " planned pairs");
}

// One message from the ROUTER without waiting; false when none is queued.
bool RelayLoop::readOne() {
  zmq::message_t frame;
  if (!router_.recv(frame, zmq::recv_flags::dontwait)) return false;
  // [routing id][kind]… ; libzmq hands over whole messages, so the rest is there already. Frames
  // past what any message of the wire has are read and freed at once, never kept.
  const size_t most = options_.max_payload_frames + 3;
  std::vector<zmq::message_t> frames;
  bool too_many = false, cut = false;
  for (;;) {
    const bool more = frame.more();
    if (frames.size() < most)
      frames.push_back(std::move(frame));
    else
      too_many = true;
    if (!more) break;
    frame = zmq::message_t();
    if (!router_.recv(frame, zmq::recv_flags::dontwait)) {
      cut = true;
      break;
    }
  }
  applyPendingLinks();  // a setLinks before this message counts for it
  drainMonitor();       // a connection closed before this message came is forgotten first
  if (too_many || cut) {
    count(&RelayStats::malformed);
    return true;
  }
  takeMessage(frames);
  return true;
}

void RelayLoop::takeMessage(std::vector<zmq::message_t>& frames) {
  if (frames.size() < 2 || frames[1].size() != 1) {
    count(&RelayStats::malformed);
    return;
  }
  const char* user_id = zmq_msg_gets(frames[1].handle(), "User-Id");
  const std::string user = user_id ? user_id : "";
  const char kind = *frames[1].data<char>();
  if (kind == kRelayAttach[0] && frames.size() == 3) {
    takeAttach(frames, user);
    return;
  }
  if (kind == kRelayData[0] && frames.size() >= 4) {
    std::string from;
    if (!memberOfUser(user, &from)) {
      count(&RelayStats::revoked);
      return;
    }
    takeData(from, frames);
    return;
  }
  count(&RelayStats::malformed);
}

void RelayLoop::takeAttach(std::vector<zmq::message_t>& frames, const std::string& user) {
  const std::string claimed = frames[2].to_string();
  std::string name;
  if (!memberOfUser(user, &name)) {
    count(&RelayStats::revoked);
    return;
  }
  if (claimed != name) {
    uint64_t forged = 0;
    {
      std::lock_guard<std::mutex> lock(stats_mutex_);
      forged = ++stats_.forged_attaches;
    }
    if (logWorthy(forged))  // a hostile client cannot flood the log
      CAIRN_WARN("relay: dropped an attach naming \"", claimed.substr(0, 64),
                 "\" from the connection of \"", name, "\" (", forged, " so far)");
    return;
  }
  Member& member = members_.at(name);
  std::string routing_id = frames[0].to_string();
  const bool anew = member.routing_id != routing_id;
  member.routing_id = std::move(routing_id);
  member.fd = zmq_msg_get(frames[2].handle(), ZMQ_SRCFD);
  count(&RelayStats::attaches);
  sendPresence(name);
  if (anew) {
    CAIRN_DEBUG("relay: ", name, " attached");
    presenceToPartners(name);
  }
}

// Closed connections: a member whose attached connection closed is forgotten, and its partners
// hear it at once.
void RelayLoop::drainMonitor() {
  uint16_t event = 0;
  uint32_t value = 0;
  while (readMonitorEvent(monitor_, &event, &value)) {
    if (event != ZMQ_EVENT_DISCONNECTED) continue;
    std::vector<std::string> gone;
    for (const auto& [name, member] : members_)
      if (member.attached() && member.fd == static_cast<int>(value)) gone.push_back(name);
    for (const auto& name : gone) {
      forget(name);
      CAIRN_DEBUG("relay: ", name, " detached");
      presenceToPartners(name);
    }
  }
}

void RelayLoop::forget(const std::string& name) {
  auto it = members_.find(name);
  if (it == members_.end() || !it->second.attached()) return;
  it->second.routing_id.clear();
  it->second.fd = -1;
  it->second.unattached_since = Clock::now();
}

// The member a connection authenticated as: its User-Id is "NAME KEY" (Relay::setLinks), taken
// only while NAME is still listed with KEY.
const RelayLoop::Member* RelayLoop::memberOfUser(const std::string& user, std::string* name) const {
  const auto space = user.rfind(' ');
  if (space == std::string::npos) return nullptr;
  auto it = members_.find(user.substr(0, space));
  if (it == members_.end() || it->second.key != user.substr(space + 1)) return nullptr;
  *name = it->first;
  return &it->second;
}

bool RelayLoop::planned(const std::string& a, const std::string& b) const {
  return a < b ? pairs_.count({a, b}) > 0 : pairs_.count({b, a}) > 0;
}

std::vector<std::string> RelayLoop::partnersOf(const std::string& name) const {
  std::vector<std::string> partners;
  for (const auto& [a, b] : pairs_) {
    if (a == name) partners.push_back(b);
    if (b == name) partners.push_back(a);
  }
  std::sort(partners.begin(), partners.end());
  return partners;
}

// ["P", the attached partners…] to `name`, when it is attached and its pipe has room.
void RelayLoop::sendPresence(const std::string& name) {
  auto it = members_.find(name);
  if (it == members_.end() || !it->second.attached()) return;
  std::vector<std::string> head{kRelayPresence};
  for (const auto& partner : partnersOf(name))
    if (members_.at(partner).attached()) head.push_back(partner);
  std::vector<zmq::message_t> none;
  (void)relaySend(router_, it->second.routing_id, head, none);
}

void RelayLoop::presenceToPartners(const std::string& name) {
  for (const auto& partner : partnersOf(name)) sendPresence(partner);
}

}  // namespace cairn
