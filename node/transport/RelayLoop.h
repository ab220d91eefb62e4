// The relay's loop (node/transport/Relay.h): the thread that reads the ROUTER and its monitor,
// takes attaches, answers presence, forwards data and keeps the per-link queues. Internal to the
// relay: Relay.cpp (reading, attaches, presence, links) and RelayQueues.cpp (forwarding, queues,
// pacing). Thread-safety: run() and everything it calls belong to the loop thread; setLinks() and
// stats() from any thread (their own mutexes).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "core/SendPacer.h"
#include "node/transport/Relay.h"

namespace cairn {

// Sends [routing id][head…][tail…] to one client of `router` without waiting: false (nothing
// sent) when its pipe is full or it has no connection now. `tail`'s frames are consumed when sent.
bool relaySend(zmq::socket_t& router, const std::string& routing_id,
               const std::vector<std::string>& head, std::vector<zmq::message_t>& tail);

// The relay loop's waits: with nothing queued for an attached destination, it polls its sockets
// this long at most (its housekeeping: links set, queues of absent destinations dropped)...
inline constexpr std::chrono::milliseconds kRelayIdlePoll{20};
// ...and waits at most this long before trying a full pipe again (RelayQueues.cpp serviceQueues).
inline constexpr std::chrono::milliseconds kRelayFullRetryMax{16};

class RelayLoop {
 public:
  using Clock = std::chrono::steady_clock;
  using Link = std::pair<std::string, std::string>;  // (from, to)
  RelayLoop(const RelayOptions& options, zmq::socket_t router, zmq::socket_t monitor);
  ~RelayLoop();
  RelayLoop(const RelayLoop&) = delete;
  RelayLoop& operator=(const RelayLoop&) = delete;

  void run(const std::atomic<bool>& stop);  // the loop thread, until `stop`
  void setLinks(std::map<std::string, std::string> members, std::set<Link> pairs);  // any thread
  RelayStats stats() const;                                                         // any thread

 private:
  struct Member {
    std::string key;                     // Z85
    std::string routing_id;              // of the attached connection; empty when none
    int fd = -1;                         // that connection's socket (ZMQ_SRCFD)
    Clock::time_point unattached_since;  // when it stopped being attached (or was listed)
    bool attached() const { return !routing_id.empty(); }
  };
  struct Waiting {
    std::vector<zmq::message_t> payload;
    uint64_t bytes = 0;  // the payload frames' sizes
    uint64_t cost = 0;   // what it counts against the budget
  };
  struct LinkQueue {
    std::deque<Waiting> messages;
    uint64_t cost = 0;
  };
  enum class Sent { kSent, kNoRoom, kPaced };

  // Relay.cpp
  void applyPendingLinks();
  bool readOne();
  void takeMessage(std::vector<zmq::message_t>& frames);
  void takeAttach(std::vector<zmq::message_t>& frames, const std::string& user);
  void drainMonitor();
  void forget(const std::string& name);
  std::vector<std::string> partnersOf(const std::string& name) const;
  void sendPresence(const std::string& name);
  void presenceToPartners(const std::string& name);
  const Member* memberOfUser(const std::string& user, std::string* name) const;
  bool planned(const std::string& a, const std::string& b) const;
  void count(uint64_t RelayStats::*counter, uint64_t n = 1);
  // RelayQueues.cpp
  void takeData(const std::string& from, std::vector<zmq::message_t>& frames);
  Sent trySend(const Link& link, Waiting& message, Clock::time_point now);
  void enqueue(const Link& link, Waiting message);
  void leftQueue(const Waiting& message);  // stats: one message less waiting
  // How long until the loop should try the queues again; nothing when none waits for an attached
  // destination.
  std::optional<Clock::duration> serviceQueues(Clock::time_point now);
  void dropQueues(bool (*drop)(const RelayLoop&, const Link&, Clock::time_point),
                  Clock::time_point now);
  static bool unattachedTooLong(const RelayLoop& loop, const Link& link, Clock::time_point now);
  static bool noLongerPlanned(const RelayLoop& loop, const Link& link, Clock::time_point now);
  // RelayTamper.cpp (RelayOptions::test_tamper_seed): false when the message is not forwarded now.
  bool tamper(const Link& link, Waiting& message);
  void forward(const Link& link, Waiting message);

  const RelayOptions options_;
  zmq::socket_t router_;
  zmq::socket_t monitor_;
  std::map<std::string, Member> members_;  // loop thread
  std::set<Link> pairs_;                   // loop thread; each pair with first < second
  std::map<Link, LinkQueue> queues_;       // loop thread; only non-empty ones
  std::unique_ptr<SendPacer> pacer_;  // --relay-mbps (null: no cap), asked before each send
  Link last_sent_;  // the link that sent last: the next turn starts after it (serviceQueues)
  Clock::duration full_retry_{};  // the wait before trying a full pipe again (serviceQueues)
  uint64_t tamper_state_ = 0;  // test_tamper_seed's generator (splitmix64)
  uint64_t tampered_logged_ = 0;
  std::vector<std::pair<Link, Waiting>> held_;  // tampering: messages going after the next one

  std::mutex pending_mutex_;  // the next setLinks, carried out by the loop
  std::atomic<bool> links_pending_{false};
  std::map<std::string, std::string> pending_members_;
  std::set<Link> pending_pairs_;

  mutable std::mutex stats_mutex_;
  RelayStats stats_;
};

}  // namespace cairn
