// The relay's forwarding side (Relay.h, RelayLoop.h): a data message goes to its destination at
// once or waits in its link's queue (from → to) within the link's budget; the loop retries the
// queues, paced (core/SendPacer.h, asked without waiting), and drops those nobody will take.
#include <algorithm>
#include <cerrno>

#include "core/Log.h"
#include "node/transport/RelayLoop.h"

namespace cairn {
// ---------------------------------------------------------------- sending

bool relaySend(zmq::socket_t& router, const std::string& routing_id,
               const std::vector<std::string>& head, std::vector<zmq::message_t>& tail) {
  zmq::message_t id(routing_id.data(), routing_id.size());
  try {
    // ROUTER_MANDATORY: the routing-id frame fails with EAGAIN while the client's pipe is full
    // (cppzmq: no value) and with EHOSTUNREACH when it has no connection (throws).
    if (!router.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return false;
    throw;
  }
  // Once the routing id is queued, the rest of the message goes into the same pipe (libzmq checks
  // the high-water mark per message); should that pipe close meanwhile, libzmq drops the message.
  const size_t n = head.size() + tail.size();
  for (size_t i = 0; i < n; ++i) {
    const auto flags =
        (i + 1 < n ? zmq::send_flags::sndmore : zmq::send_flags::none) | zmq::send_flags::dontwait;
    if (i < head.size()) {
      zmq::message_t frame(head[i].data(), head[i].size());
      (void)router.send(frame, flags);
    } else {
      (void)router.send(tail[i - head.size()], flags);
    }
  }
  return true;
}

// ---------------------------------------------------------------- RelayLoop: forwarding

void RelayLoop::takeData(const std::string& from, std::vector<zmq::message_t>& frames) {
  // [routing id]["D"][TO][payload…]
  const std::string to = frames[2].to_string();
  if (!members_.count(to) || !planned(from, to)) {
    count(&RelayStats::refused_unplanned);
    return;
  }
  Waiting message;
  message.payload.reserve(frames.size() - 3);
  for (size_t i = 3; i < frames.size(); ++i) {
    message.bytes += frames[i].size();
    message.cost += frames[i].size() + kRelayFrameOverhead;
    message.payload.push_back(std::move(frames[i]));
  }
  const Link link{from, to};
  if (options_.test_tamper_seed != 0 && !tamper(link, message)) return;
  forward(link, std::move(message));
  std::vector<std::pair<Link, Waiting>> held;
  held.swap(held_);
  for (auto& [held_link, held_message] : held) forward(held_link, std::move(held_message));
}

void RelayLoop::forward(const Link& link, Waiting message) {
  // Behind whatever of this link already waits: a link's messages keep their order.
  if (!queues_.count(link) && trySend(link, message, Clock::now()) == Sent::kSent) return;
  enqueue(link, std::move(message));
}

RelayLoop::Sent RelayLoop::trySend(const Link& link, Waiting& message, Clock::time_point now) {
  auto to = members_.find(link.second);
  if (to == members_.end() || !to->second.attached()) return Sent::kNoRoom;
  if (pacer_ && !pacer_->mayGoNow()) return Sent::kPaced;
  if (!relaySend(router_, to->second.routing_id, {kRelayData, link.first}, message.payload))
    return Sent::kNoRoom;
  if (pacer_) (void)pacer_->reserve(message.bytes);  // zero: mayGoNow said so
  std::lock_guard<std::mutex> lock(stats_mutex_);
  ++stats_.messages_forwarded;
  stats_.bytes_forwarded += message.bytes;
  stats_.bytes_per_link[link] += message.bytes;
  return Sent::kSent;
}

void RelayLoop::enqueue(const Link& link, Waiting message) {
  auto it = queues_.find(link);
  const uint64_t waiting = it == queues_.end() ? 0 : it->second.cost;
  if (waiting + message.cost > static_cast<uint64_t>(options_.link_budget_bytes)) {
    uint64_t refused = 0;
    {
      std::lock_guard<std::mutex> lock(stats_mutex_);
      refused = ++stats_.refused_over_budget;
    }
    if (refused == 1 || refused % 1000 == 0)
      CAIRN_WARN("relay: the link ", link.first, " → ", link.second, " has ", waiting,
                 " bytes waiting: dropped a message of ", message.bytes, " (", refused,
                 " dropped over budget so far)");
    return;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.messages_waiting;
    stats_.bytes_waiting += message.bytes;
  }
  LinkQueue& queue = queues_[link];
  queue.cost += message.cost;
  queue.messages.push_back(std::move(message));
}

// Sends what waits, link by link (starting after the link that sent last, so that a pacer or a
// full pipe holding some back favours no link), each link's in order. Returns when to try again,
// if anything still waits for an attached destination. Held back by the pacer: when it lets the next message
// go (SendPacer::untilMayGo), within 1 ms and kRelayIdlePoll. Held back by a full pipe: libzmq
// tells no one when one client's pipe of a ROUTER has room again, so the loop tries again after
// 1 ms, then 2, 4, up to kRelayFullRetryMax while nothing goes out, and after 1 ms again once
// something does. (Before, it came back every millisecond: a thousand turns a second for as long
// as a slow destination or the cap held messages back; RelayStats::loop_turns counts them.)
std::optional<RelayLoop::Clock::duration> RelayLoop::serviceQueues(Clock::time_point now) {
  // Round robin by message: the links after the one that sent last come first. (A turn counter
  // was fair only while the loop turned a thousand times a second; with turns at the pacer's
  // times and on input, an even count between them kept one link first, and the acknowledgements
  // of relayed links starved behind a stream of data until their senders resent.)
  std::vector<Link> order;
  order.reserve(queues_.size());
  const auto after = queues_.upper_bound(last_sent_);
  for (auto it = after; it != queues_.end(); ++it) order.push_back(it->first);
  for (auto it = queues_.begin(); it != after; ++it) order.push_back(it->first);
  std::set<std::string> full;  // destinations whose pipe had no room this turn
  bool paced = false, waiting = false, sent_any = false;
  for (const Link& link : order) {
    LinkQueue& queue = queues_.at(link);
    auto to = members_.find(link.second);
    if (to == members_.end() || !to->second.attached()) continue;
    while (!queue.messages.empty() && !paced && !full.count(link.second)) {
      const Sent sent = trySend(link, queue.messages.front(), now);
      if (sent == Sent::kPaced) {
        paced = true;
      } else if (sent == Sent::kNoRoom) {
        full.insert(link.second);
      } else {
        sent_any = true;
        last_sent_ = link;
        leftQueue(queue.messages.front());
        queue.cost -= queue.messages.front().cost;
        queue.messages.pop_front();
      }
    }
    if (queue.messages.empty())
      queues_.erase(link);
    else
      waiting = true;
  }
  if (!waiting) {
    full_retry_ = Clock::duration::zero();
    return std::nullopt;
  }
  constexpr Clock::duration kFirst = std::chrono::milliseconds(1);
  Clock::duration retry = kRelayIdlePoll;
  if (paced) retry = std::clamp<Clock::duration>(pacer_->untilMayGo(), kFirst, kRelayIdlePoll);
  if (full.empty()) {
    full_retry_ = Clock::duration::zero();  // the next full pipe starts from 1 ms again
  } else {
    const bool first = sent_any || full_retry_ < kFirst;
    full_retry_ = first ? kFirst : std::min<Clock::duration>(2 * full_retry_, kRelayFullRetryMax);
    retry = std::min(retry, full_retry_);
  }
  return retry;
}

void RelayLoop::dropQueues(bool (*drop)(const RelayLoop&, const Link&, Clock::time_point),
                           Clock::time_point now) {
  for (auto it = queues_.begin(); it != queues_.end();) {
    if (!drop(*this, it->first, now)) {
      ++it;
      continue;
    }
    CAIRN_INFO("relay: dropped ", it->second.messages.size(), " messages waiting for ",
               it->first.second, " from ", it->first.first);
    count(&RelayStats::dropped_waiting, it->second.messages.size());
    for (const Waiting& message : it->second.messages) leftQueue(message);
    it = queues_.erase(it);
  }
}

void RelayLoop::leftQueue(const Waiting& message) {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  --stats_.messages_waiting;
  stats_.bytes_waiting -= message.bytes;
}

bool RelayLoop::unattachedTooLong(const RelayLoop& loop, const Link& link, Clock::time_point now) {
  auto to = loop.members_.find(link.second);
  if (to == loop.members_.end()) return true;
  return !to->second.attached() &&
         now - to->second.unattached_since >= loop.options_.unattached_drop_after;
}

bool RelayLoop::noLongerPlanned(const RelayLoop& loop, const Link& link, Clock::time_point) {
  return !loop.planned(link.first, link.second);
}

}  // namespace cairn
