#include "coordinator/FloodGuard.h"

#include <algorithm>
#include <sstream>

#include "core/Log.h"

namespace cairn::coordinator {

FloodGuard::FloodGuard(FloodLimits limits, size_t max_attachment_bytes) : limits_(limits) {
  if (limits_.byte_burst <= 0) limits_.byte_burst = double(max_attachment_bytes) + double(1 << 20);
}

FloodGuard::Verdict FloodGuard::check(const std::string& key, size_t bytes, double now) {
  if (keys_.size() >= limits_.max_keys && !keys_.count(key)) forgetRefilled(now);
  auto [it, fresh] = keys_.try_emplace(key);
  Key& k = it->second;
  if (fresh) {
    k.messages = limits_.message_burst;
    k.bytes = limits_.byte_burst;
    k.last = now;
  }
  if (k.blocked_until >= 0) {
    if (now < k.blocked_until) {
      ++dropped_;
      return Verdict::kBlocked;
    }
    k = Key{limits_.message_burst, limits_.byte_burst, now, 0, -1e300, -1};  // served: a fresh start
  }
  const double elapsed = std::max(0.0, now - k.last);
  k.last = now;
  k.messages = std::min(limits_.message_burst, k.messages + elapsed * limits_.messages_per_s);
  k.bytes = std::min(limits_.byte_burst, k.bytes + elapsed * limits_.bytes_per_s);
  if (k.messages >= 1 && k.bytes >= double(bytes)) {
    k.messages -= 1;
    k.bytes -= double(bytes);
    return Verdict::kTake;
  }
  ++dropped_;
  // A steady flooder gets a message taken whenever a token refills (every 1/messages_per_s s):
  // counting only drops in a row, such a flooder was never blocked.
  if (now - k.last_drop > limits_.quiet_s) k.dropped_in_episode = 0;
  k.last_drop = now;
  if (++k.dropped_in_episode >= limits_.drop_after) {
    k.blocked_until = now + limits_.block_s;
    ++blocked_;
    return Verdict::kBlockNow;
  }
  return k.dropped_in_episode == 1 ? Verdict::kDropTell : Verdict::kDrop;
}

void FloodGuard::forgetRefilled(double now) {
  for (auto it = keys_.begin(); it != keys_.end();) {
    const Key& k = it->second;
    const double elapsed = now - k.last;
    const bool refilled = k.messages + elapsed * limits_.messages_per_s >= limits_.message_burst &&
                          k.bytes + elapsed * limits_.bytes_per_s >= limits_.byte_burst;
    it = k.blocked_until < 0 && refilled ? keys_.erase(it) : std::next(it);
  }
}

std::optional<Rejected> floodAnswer(FloodGuard::Verdict verdict, const FloodLimits& limits, const std::string& who) {
  if (verdict != FloodGuard::Verdict::kDropTell && verdict != FloodGuard::Verdict::kBlockNow) return std::nullopt;
  std::ostringstream limit;
  limit << "this key may send at most " << limits.messages_per_s << " messages (" << limits.message_burst
        << " at once) and " << limits.bytes_per_s / double(1 << 20) << " MiB a second";
  if (verdict == FloodGuard::Verdict::kDropTell)
    return Rejected{"too many messages: " + limit.str() + "; what comes faster is dropped"};
  std::ostringstream blocked;
  blocked << "blocked for " << limits.block_s << " s after " << limits.drop_after
          << " messages dropped in one flood (no " << limits.quiet_s << " s without a drop; "
          << limit.str() << ")";
  CAIRN_WARN("coordinator: key ", who, " is ", blocked.str(), ": its messages are dropped unanswered");
  return Rejected{blocked.str()};
}

}  // namespace cairn::coordinator
