#include "node/Mailbox.h"

#include "core/Log.h"

namespace cairn {

std::optional<Message> Mailbox::receive(const Match& match, std::chrono::milliseconds timeout) {
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
    auto message = transport_.receive(std::max(left, std::chrono::milliseconds(0)));
    if (!message) return std::nullopt;
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
