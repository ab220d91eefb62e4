// Mailbox: selective receive over one Transport. The pipeline, heartbeats and collectives share a
// node's single inbound socket; each asks for the message it is waiting for (by kind, sender, tag,
// step…) and the mailbox keeps the others, oldest first, for whoever asks for them next.
// The buffer is bounded: past `max_buffered` messages the oldest is dropped and counted, so a
// peer flooding us with messages nobody asks for cannot exhaust memory.
// Ownership: borrows the transport. Thread-safety: the transport's owning thread only.
#pragma once

#include <deque>
#include <functional>

#include "node/Transport.h"

namespace cairn {

class Mailbox {
 public:
  using Match = std::function<bool(const Message&)>;

  explicit Mailbox(Transport& transport, size_t max_buffered = 4096)
      : transport_(transport), max_buffered_(max_buffered) {}

  // The oldest buffered or arriving message for which `match` is true; nullopt after `timeout`.
  [[nodiscard]] std::optional<Message> receive(const Match& match,
                                               std::chrono::milliseconds timeout);
  // The same, but also gives up (nullopt) as soon as `give_up` returns true; it is asked whenever
  // the transport reports a change in a peer's liveness or a signal (receiveOrLivenessChange), so
  // a waiter for one peer sees its connection go down without polling.
  [[nodiscard]] std::optional<Message> receive(const Match& match,
                                               std::chrono::milliseconds timeout,
                                               const std::function<bool()>& give_up);
  // Removes every buffered message for which `match` is true (stale messages of an abandoned
  // run); returns how many.
  size_t purge(const Match& match);
  // Puts a message taken by receive() back at the front (it was someone else's to handle).
  void putBack(Message message) { buffer_.push_front(std::move(message)); }
  [[nodiscard]] SendStatus send(const std::string& peer, const Message& message,
                                std::chrono::milliseconds timeout) {
    return transport_.send(peer, message, timeout);
  }
  Transport& transport() { return transport_; }
  size_t buffered() const { return buffer_.size(); }
  uint64_t droppedForSpace() const { return dropped_for_space_; }

 private:
  Transport& transport_;
  size_t max_buffered_;
  std::deque<Message> buffer_;
  uint64_t dropped_for_space_ = 0;
};

}  // namespace cairn
