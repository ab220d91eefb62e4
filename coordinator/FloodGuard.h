// FloodGuard: how much one volunteer key may send the coordinator (docs/OPERATIONS.md "Floods").
// The coordinator is a network service anyone holding the invite can reach, and it serves every
// volunteer from one loop: a key that sends joins, heartbeats, metrics batches, chunk requests or
// uploads faster than any volunteer needs would starve the others. Each key (its CURVE public key,
// the ZAP User-Id) has two token buckets, messages and bytes (FloodLimits), charged before its
// message is decoded. Over budget, the message is dropped undecoded. Drops come in *episodes*: one
// begins with a drop after `quiet_s` without any, and lasts while drops keep coming (messages taken
// between, as the refill lets some through, do not end it). The first drop of an episode is
// answered once (`rejected`, naming the limits), the rest silently. A key that keeps flooding —
// `drop_after` drops in one episode — is blocked for `block_s`: every message
// of it is dropped unanswered, so a flooding member's heartbeats stop counting and, past
// --lost-after-s, its node goes to a spare like any lost volunteer's.
// Memory: one entry per key seen; past `max_keys` entries, those whose buckets have refilled and
// that are not blocked are forgotten (they are indistinguishable from a key never seen).
// Written by hand: token buckets are a few lines, and no library here has one.
// Thread-safety: the coordinator's loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <optional>
#include <unordered_map>

#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

struct FloodLimits {
  double messages_per_s = 50;      // sustained, per key
  double message_burst = 500;      // at once (joins, uploads and chunk requests come in bursts)
  double bytes_per_s = 64 << 20;   // sustained, per key
  double byte_burst = 0;           // 0: max_attachment_bytes + 1 MiB (the largest message fits)
  uint64_t drop_after = 1000;      // dropped in one episode: the key is blocked
  double quiet_s = 10;             // without a drop: the episode is over
  double block_s = 300;            // for this long
  size_t max_keys = 100000;        // entries kept before refilled ones are forgotten
};

class FloodGuard {
 public:
  enum class Verdict {
    kTake,       // within its budget: handle it
    kDropTell,   // over budget, the first drop since it was last within it: answer once
    kDrop,       // over budget again: drop silently
    kBlockNow,   // the drop that blocks the key: answer once, log once
    kBlocked,    // blocked: drop silently
  };

  // `max_attachment_bytes`: the coordinator's limit per attachment (byte_burst 0 derives from it).
  FloodGuard(FloodLimits limits, size_t max_attachment_bytes);

  // Charges one message of `bytes` from `key` at `now` (seconds, any monotonic origin).
  Verdict check(const std::string& key, size_t bytes, double now);

  const FloodLimits& limits() const { return limits_; }
  size_t trackedKeys() const { return keys_.size(); }
  uint64_t dropped() const { return dropped_; }
  uint64_t blockedKeys() const { return blocked_; }  // blocks so far

 private:
  struct Key {
    double messages = 0, bytes = 0;  // tokens left
    double last = 0;                 // when they were last refilled
    uint64_t dropped_in_episode = 0;
    double last_drop = -1e300;       // when its last message was dropped
    double blocked_until = -1;
  };
  void forgetRefilled(double now);

  FloodLimits limits_;
  std::unordered_map<std::string, Key> keys_;
  uint64_t dropped_ = 0, blocked_ = 0;
};

// What the coordinator answers a message it did not take (`verdict` other than kTake) from `who`
// (for the log): kDropTell and kBlockNow are answered once, naming the limits (kBlockNow is also
// logged); the rest: nothing.
std::optional<Rejected> floodAnswer(FloodGuard::Verdict verdict, const FloodLimits& limits, const std::string& who);

}  // namespace cairn::coordinator
