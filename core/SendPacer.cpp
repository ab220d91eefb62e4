#include "core/SendPacer.h"

#include <algorithm>
#include <thread>

#include "core/Error.h"

namespace cairn {
namespace {

// Rounded up: the schedule never runs ahead of the rate by the clock's rounding.
SendPacer::Clock::duration atRate(uint64_t bytes, double mbps) {
  return std::chrono::ceil<SendPacer::Clock::duration>(
      std::chrono::duration<double>(double(bytes) * 8 / (mbps * 1e6)));
}

}  // namespace

SendPacer::SendPacer(double mbps, uint64_t burst_bytes, std::function<Clock::time_point()> now)
    : mbps_(mbps), burst_(atRate(burst_bytes, mbps)), now_(std::move(now)) {
  CAIRN_ENFORCE(mbps > 0, "SendPacer needs a rate above 0");
  if (!now_) now_ = [] { return Clock::now(); };
}

SendPacer::Clock::duration SendPacer::reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point now = now_();
  const Clock::time_point start = std::max(theoretical_, now);
  const Clock::time_point may_send = start - burst_;  // up to the burst ahead of the schedule
  theoretical_ = start + atRate(bytes, mbps_);
  reserved_ += bytes;
  return may_send > now ? may_send - now : Clock::duration::zero();
}

void SendPacer::take(uint64_t bytes) {
  const Clock::duration wait = reserve(bytes);
  if (wait > Clock::duration::zero()) std::this_thread::sleep_for(wait);
}

bool SendPacer::mayGoNow() const { return untilMayGo() == Clock::duration::zero(); }

SendPacer::Clock::duration SendPacer::untilMayGo() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Clock::time_point may_send = theoretical_ - burst_;
  const Clock::time_point now = now_();
  return may_send > now ? may_send - now : Clock::duration::zero();
}

uint64_t SendPacer::reservedBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

}  // namespace cairn
