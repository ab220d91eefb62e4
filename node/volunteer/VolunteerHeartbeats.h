// VolunteerHeartbeats: while a volunteer trains, a background thread tells the coordinator it is
// alive: `heartbeat{name, state, step}` every interval (docs/PROTOCOL.md "Coordination"; state and
// step from `progress` when given: VolunteerMetrics::progress, else `state` and -1), on its
// own DEALER socket (node/volunteer/VolunteerSockets.h, ZMQ_IMMEDIATE). The coordinator is never on the
// training path: a send never waits (a coordinator that is down just means the heartbeat is not
// sent), ZeroMQ reconnects by itself, and the thread logs once when the coordinator stops taking
// heartbeats and once when it takes them again. Messages from the coordinator on this socket are
// read: `peers` updates and refusals go to their handlers (onPeers, onRejected) on a second thread
// of their own, in the order they came, so a handler that waits (a re-pointing behind a send, a
// stage that stops) never stops the heartbeats: a volunteer whose handler waited once stopped
// beating and was declared lost while it trained. Anything else is dropped (the coordinator
// answers a heartbeat only to refuse it).
//
// Ownership: owns its thread and socket; `context` is borrowed and must outlive it.
// Thread-safety: construct, stop() and read counters from one thread; the socket is the thread's;
// the handlers run on the handlers' thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <functional>
#include <string>
#include <utility>
#include <thread>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/protocol/Coordination.h"

namespace cairn {

class VolunteerHeartbeats {
 public:
  // The node's state and its last step, read for every heartbeat (from the heartbeats' thread).
  using Progress = std::function<std::pair<std::string, int64_t>()>;
  VolunteerHeartbeats(zmq::context_t& context, const CurveKeyPair& own, const Invite& invite,
                      std::string name, std::string state,
                      std::chrono::milliseconds interval = std::chrono::milliseconds(2000),
                      Progress progress = {});
  ~VolunteerHeartbeats();  // stop()
  VolunteerHeartbeats(const VolunteerHeartbeats&) = delete;
  VolunteerHeartbeats& operator=(const VolunteerHeartbeats&) = delete;

  // Stops the thread (within about 100 ms) and closes the socket.
  void stop();

  // `peers` updates the coordinator sends on this socket (a neighbour or ring peer was replaced,
  // docs/PROTOCOL.md) go to `handler`, called on the handlers' thread; without one they are
  // dropped like any other message.
  void onPeers(std::function<void(const PeersUpdate&)> handler);
  // The coordinator refusing a heartbeat (`rejected{reason, node_taken}`: this volunteer no longer
  // holds the node it beats for, e.g. a spare took it over while it was frozen) goes to `handler`,
  // on the handlers' thread; without one it is logged and dropped.
  void onRejected(std::function<void(const Rejected&)> handler);

  uint64_t sent() const { return sent_.load(); }
  uint64_t unsent() const { return unsent_.load(); }        // not sent: the coordinator was away
  uint64_t received() const { return received_.load(); }    // messages read and dropped

 private:
  void run();
  void runHandlers();
  // Queues `call` for the handlers' thread (at most kMaxQueued; the oldest is dropped, logged).
  void handLater(std::function<void()> call);
  static constexpr size_t kMaxQueued = 64;

  zmq::socket_t socket_;
  std::string coordinator_;  // for log lines
  std::string name_, state_;
  std::chrono::milliseconds interval_;
  Progress progress_;
  std::mutex peers_mutex_;  // guards on_peers_ (set from the owner's thread)
  std::function<void(const Rejected&)> on_rejected_;  // guarded by peers_mutex_
  std::function<void(const PeersUpdate&)> on_peers_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0}, unsent_{0}, received_{0};
  std::thread thread_;
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;  // under queue_mutex_
  std::thread handlers_;
};

}  // namespace cairn
