#include "node/transport/Mailbox.h"

#include <vector>

#include "core/Log.h"

namespace cairn {

using Clock = std::chrono::steady_clock;

Mailbox::Mailbox(Transport& transport, size_t max_buffered)
    : transport_(transport), max_buffered_(max_buffered) {
  transport_.setSendWaitHook([this] { drainWhileSending(); });
}

Mailbox::~Mailbox() { transport_.setSendWaitHook({}); }

std::optional<Message> Mailbox::receive(const Match& match, std::chrono::milliseconds timeout) {
  return receive(match, timeout, {});
}

void Mailbox::drainWhileSending() {
  constexpr size_t kMostPerCall = 256;
  std::unique_lock<std::mutex> lock(mutex_);
  if (receiving_) return;  // a waiter reads the transport already
  receiving_ = true;
  lock.unlock();
  std::vector<Message> arrived;
  try {
    for (size_t i = 0; i < kMostPerCall; ++i) {
      std::optional<Message> message = transport_.receive(std::chrono::milliseconds(0));
      if (!message) break;
      arrived.push_back(std::move(*message));
    }
  } catch (const std::exception& e) {
    CAIRN_WARN("mailbox: reading the transport while a send waits failed: ", e.what());
  }
  lock.lock();
  receiving_ = false;
  for (Message& m : arrived) keepForLater(std::move(m));
  ++wakeups_;  // liveness may have moved too: every waiter re-checks
  changed_.notify_all();
}

size_t Mailbox::purge(const Match& match) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t before = buffer_.size();
  for (auto it = buffer_.begin(); it != buffer_.end();) it = match(*it) ? buffer_.erase(it) : it + 1;
  return before - buffer_.size();
}

void Mailbox::putBack(Message message) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffer_.push_front(std::move(message));
  changed_.notify_all();
}

size_t Mailbox::buffered() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffer_.size();
}

uint64_t Mailbox::droppedForSpace() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_for_space_;
}

void Mailbox::keepForLater(Message message) {
  if (buffer_.size() >= max_buffered_) {
    ++dropped_for_space_;
    CAIRN_WARN("mailbox full (", max_buffered_, " messages): dropped a ",
               toString(buffer_.front().kind), " message from ", buffer_.front().sender);
    buffer_.pop_front();
  }
  buffer_.push_back(std::move(message));
}

// Leader/follower (see the header): whoever finds the transport free reads it, without the lock,
// up to its own deadline; the others wait on `changed_` and look at the buffer whenever the
// receiver files something, gives up the transport, or was woken early by a liveness change.
std::optional<Message> Mailbox::receive(const Match& match, std::chrono::milliseconds timeout,
                                        const std::function<bool()>& give_up) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t seen_wakeups = wakeups_;
  for (;;) {
    for (auto it = buffer_.begin(); it != buffer_.end(); ++it) {
      if (match(*it)) {
        Message found = std::move(*it);
        buffer_.erase(it);
        return found;
      }
    }
    if (give_up && wakeups_ != seen_wakeups) {
      seen_wakeups = wakeups_;
      if (give_up()) return std::nullopt;
    }
    const auto now = Clock::now();
    if (receiving_) {
      if (now >= deadline) return std::nullopt;
      changed_.wait_until(lock, deadline);
      continue;
    }
    // The transport is free: read it ourselves (at least once, even with no time left, so a
    // zero timeout still takes what has already arrived).
    receiving_ = true;
    lock.unlock();
    const auto wait =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                 std::chrono::milliseconds(0));
    std::optional<Message> message;
    try {
      message = transport_.receiveOrLivenessChange(wait);
    } catch (...) {
      lock.lock();
      receiving_ = false;
      changed_.notify_all();
      throw;
    }
    lock.lock();
    receiving_ = false;
    if (!message) {
      // Timed out, or woken early by a liveness change or a signal: every waiter re-checks.
      const bool early = Clock::now() < deadline;
      if (early) ++wakeups_;
      changed_.notify_all();
      if (!early) return std::nullopt;
      seen_wakeups = wakeups_;
      if (give_up && give_up()) return std::nullopt;
      continue;
    }
    if (match(*message)) {
      changed_.notify_all();  // the transport is free again for the next waiter
      return message;
    }
    keepForLater(std::move(*message));
    changed_.notify_all();
    if (Clock::now() >= deadline) return std::nullopt;
  }
}

}  // namespace cairn
