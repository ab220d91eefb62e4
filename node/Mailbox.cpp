#include "node/Mailbox.h"

#include "core/Log.h"

namespace cairn {

std::optional<Message> Mailbox::receive(const Match& match, std::chrono::milliseconds timeout) {
  return receive(match, timeout, {});
}

size_t Mailbox::purge(const Match& match) {
  const size_t before = buffer_.size();
  for (auto it = buffer_.begin(); it != buffer_.end();) it = match(*it) ? buffer_.erase(it) : it + 1;
  return before - buffer_.size();
}

std::optional<Message> Mailbox::receive(const Match& match, std::chrono::milliseconds timeout,
                                        const std::function<bool()>& give_up) {
  for (auto it = buffer_.begin(); it != buffer_.end(); ++it) {
    if (match(*it)) {
      Message found = std::move(*it);
      buffer_.erase(it);
      return found;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto wait = std::max(left, std::chrono::milliseconds(0));
    auto message = give_up ? transport_.receiveOrLivenessChange(wait) : transport_.receive(wait);
    if (!message) {
      // Woken early by a liveness change: stop if the caller says so, else wait on.
      if (!give_up || give_up() || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      continue;
    }
    if (match(*message)) return message;
    if (buffer_.size() >= max_buffered_) {
      ++dropped_for_space_;
      CAIRN_WARN("mailbox full (", max_buffered_, " messages): dropped a ",
                 toString(buffer_.front().kind), " message from ", buffer_.front().sender);
      buffer_.pop_front();
    }
    buffer_.push_back(std::move(*message));
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
  }
}

}  // namespace cairn
