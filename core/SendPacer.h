// SendPacer: a cap on the rate a process sends at (`provider --join --max-mbps`), shared by its
// senders: each reserves its message's bytes before handing them over and waits its turn. The
// rule is the Generic Cell Rate Algorithm (a token bucket in its "virtual scheduling" form): a
// theoretical send time advances by bytes / rate with each reservation; a send may go once that
// time, less a burst allowance, has come. Over any stretch the bytes reserved stay within
// rate × time + burst, and a message larger than the burst goes alone and makes the next ones
// wait. Written by hand: no library here paces sends (ZeroMQ's ZMQ_RATE is for multicast only).
// Thread-safety: reserve()/take() from any thread (one mutex; the waiting happens outside it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>

namespace cairn {

class SendPacer {
 public:
  using Clock = std::chrono::steady_clock;
  // `mbps` > 0 (megabits per second, 10^6); `burst_bytes`: what may go at once after a quiet
  // stretch. `now` (tests): the clock; default Clock::now.
  SendPacer(double mbps, uint64_t burst_bytes, std::function<Clock::time_point()> now = {});

  // Reserves `bytes` and returns how long the caller must wait before sending them (0: now).
  Clock::duration reserve(uint64_t bytes);
  // reserve(), then sleeps that long.
  void take(uint64_t bytes);
  // Whether a reserve() now would not wait (the caller that cannot wait — the relay's loop — asks
  // first and keeps its message when the answer is no).
  bool mayGoNow() const;
  // How long until mayGoNow() says yes (zero: it does now), without reserving anything: how long
  // the relay's loop may sleep before it tries again.
  Clock::duration untilMayGo() const;

  double mbps() const { return mbps_; }
  uint64_t reservedBytes() const;  // in all, since construction

 private:
  double mbps_;
  Clock::duration burst_;  // burst_bytes at the rate
  std::function<Clock::time_point()> now_;
  mutable std::mutex mutex_;
  Clock::time_point theoretical_{};  // when the bytes reserved so far are due out at the rate
  uint64_t reserved_ = 0;
};

}  // namespace cairn
