// RingSchedule: how ProcessGroup's collectives cut a flat tensor and order their messages — near-
// equal parts and segments of a range, ranks around the ring, and the pipelined ring loop that
// allReduce and allGather share (docs/COLLECTIVES.md "Pipelining").
//
// Internal to node/collectives (ProcessGroup.cpp, ProcessGroupAllReduce.cpp). Ownership: none.
// Thread-safety: pure functions.
#pragma once

#include <torch/script.h>

#include <cstdint>

namespace cairn {
namespace ring_schedule {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Part `i` of `parts` near-equal parts of [0, total): sizes differ by at most one element.
inline Range part(int64_t total, int64_t parts, int64_t i) {
  return {total * i / parts, total * (i + 1) / parts};
}

inline Range subrange(const Range& outer, int64_t parts, int64_t i) {
  const Range inner = part(outer.size(), parts, i);
  return {outer.begin + inner.begin, outer.begin + inner.end};
}

inline int modulo(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

inline torch::Tensor slice(const torch::Tensor& flat, const Range& r) {
  return flat.narrow(0, r.begin, r.size());
}

// The pipelined ring loop of allReduce and allGather (docs/COLLECTIVES.md "Pipelining"): `total`
// messages numbered t = s·m + j (ring step s, segment j). Message t may be sent once message t−m
// has arrived (its data depends on it) and while at most `window` messages are sent ahead of those
// received — the window that lets a ring of blocking sends never deadlock. The loop sends
// everything allowed, then receives the next message, so sends are queued while one is reduced.
template <typename Send, typename Receive>
void windowedRing(uint64_t total, uint64_t m, uint64_t window, Send send, Receive receive) {
  uint64_t sent = 0, received = 0;
  auto canSend = [&] {
    return sent < total && sent < received + window && (sent < m || sent - m < received);
  };
  while (received < total) {
    while (canSend()) send(sent++);
    receive(received++);
  }
  while (sent < total) send(sent++);
}

}  // namespace ring_schedule
}  // namespace cairn
