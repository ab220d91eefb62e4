// Mailbox: selective receive over one Transport. The pipeline, heartbeats and collectives share a
// node's single inbound socket; each asks for the message it is waiting for (by kind, sender, tag,
// step…) and the mailbox keeps the others, oldest first, for whoever asks for them next.
// The buffer is bounded: past `max_buffered` messages the oldest is dropped and counted, so a
// peer flooding us with messages nobody asks for cannot exhaust memory.
// Ownership: borrows the transport.
// Thread-safety: every call may come from several threads at once (a node's rings sync
// concurrently, one thread per ring; docs/THREADS.md). One waiter at a time reads the transport
// (the *receiver*); it files what is not its own in the buffer and wakes the other waiters, which
// look there and take over the transport when it returns (the leader/follower pattern). A waiter
// never holds the transport past its own timeout, and sends go straight to the transport (which
// takes its own per-peer locks), so a thread waiting for room to send never keeps the others from
// receiving. With one thread, this is the plain selective receive it always was.
// Callbacks: `match` and `give_up` run on the calling thread WITH THE MAILBOX LOCK HELD (while the
// buffer is scanned and while a message read from the transport is checked). They must be quick,
// must not block, and must not call this Mailbox (it would deadlock); reading atomics or the
// message itself is what they are for.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "node/transport/Transport.h"

namespace cairn {

class Mailbox {
 public:
  using Match = std::function<bool(const Message&)>;

  // Registers drainWhileSending as the transport's send-wait hook (cleared by the destructor).
  explicit Mailbox(Transport& transport, size_t max_buffered = 4096);
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

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
  void putBack(Message message);
  [[nodiscard]] SendStatus send(const std::string& peer, const Message& message,
                                std::chrono::milliseconds timeout) {
    return transport_.send(peer, message, timeout);
  }
  Transport& transport() { return transport_; }
  size_t buffered() const;
  uint64_t droppedForSpace() const;

 private:
  // Keeps a message nobody asked for yet in the buffer (dropping the oldest when full). Caller
  // holds mutex_.
  void keepForLater(Message message);
  // A send waits for room (Transport::setSendWaitHook): when no thread reads the transport, this
  // one files what has arrived (without waiting) in the buffer. Without it a node whose threads
  // all wait to send (a ring sending to a peer that refuses it, 60 s) stops reading its inbound
  // socket, whose queue (receive_high_water_mark) fills; libzmq 4.3.4 then stops reading that
  // connection, misses the peer's ZMTP heartbeats, and when the peer gives the connection up
  // meanwhile, the next read of the buffered heartbeat aborts the process
  // (`Assertion failed: !_io_error (src/stream_engine_base.cpp:331)`, libzmq issue #4364: a
  // volunteer of the 24-volunteer soak).
  void drainWhileSending();

  Transport& transport_;
  size_t max_buffered_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // a message was filed, the receiver left, or liveness moved
  bool receiving_ = false;           // some waiter is reading the transport
  uint64_t wakeups_ = 0;             // transport returns early (liveness change, signal)
  std::deque<Message> buffer_;       // under mutex_
  uint64_t dropped_for_space_ = 0;   // under mutex_
};

}  // namespace cairn
