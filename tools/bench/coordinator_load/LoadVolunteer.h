// LoadVolunteer: one simulated volunteer of tools/bench/coordinator_load (docs/BENCHMARKS.md
// "Churn"). No training and no tensors: it speaks the real coordination protocol
// (node/protocol/Coordination.h, ChunkMessages.h) over real CurveZMQ sockets with its own key pair,
// on the cadence of the real provider's background threads (node/volunteer/*.cpp):
//   join      its reachability ROUTERs on a loopback port of its own and the next (answer the
//             coordinator's `reach`: a reachable provider answers on both, the second being
//             where dial-out-only peers connect), a `bandwidth` probe timed to its ack, `join`,
//             `accepted`. The ROUTERs are closed once accepted (the real provider keeps them
//             until its assignment, but the coordinator dials them only during the join; this
//             thirds the file descriptors a big run needs). Its ports are given (two per
//             volunteer, below the kernel's ephemeral range), never the kernel's: a port released would be handed to a later volunteer,
//             whose join the coordinator refuses (the address is a member's).
//   waiting   `heartbeat{waiting, -1}` every 2 s (VolunteerSession::waitForAssignment).
//   assigned  `heartbeat{training, step}` every 2 s (VolunteerHeartbeats), a step every
//             `step_s`, its step record queued and sent as `metrics` batches every 1 s, one batch
//             in flight, sent again after 5 s without `metrics_ack` (VolunteerMetrics); a
//             `checkpoint` of `checkpoint_bytes` every `checkpoint_every`, one in flight until
//             `checkpoint_ack` (VolunteerCheckpoints); a Root fetches its cluster's chunks and the
//             test chunks piece by piece, one piece in flight (ChunkFetcher), again every
//             `chunk_every`.
// A `rejected{node_taken}` (its node went to a spare while it was silent) is counted, not acted on:
// the real provider gives the node up and joins again as a spare; this one keeps its name.
// The real provider uses one DEALER per background thread; this one sends everything on its one
// DEALER (the coordinator answers on the routing id the message came from, so replies are the
// same). Ownership: owns its sockets; the context, options and recorder are borrowed.
// Thread-safety: one thread (the LoadThreads worker that owns it).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/protocol/Coordination.h"
#include "tools/bench/coordinator_load/LoadRecorder.h"

namespace cairn::bench::load {

using Clock = std::chrono::steady_clock;

struct VolunteerOptions {
  Invite invite;
  std::string libtorch = "99.0.0";  // newer than any writer: the coordinator refuses only older
  size_t probe_bytes = size_t(1) << 20;
  std::chrono::milliseconds heartbeat{2000};
  std::chrono::milliseconds step{500};
  std::chrono::milliseconds metrics_interval{1000};
  std::chrono::milliseconds metrics_resend{5000};
  size_t checkpoint_bytes = size_t(1) << 20;
  std::chrono::milliseconds checkpoint_every{30000};
  std::chrono::milliseconds checkpoint_resend{60000};
  size_t piece_bytes = size_t(4) << 20;
  std::chrono::milliseconds chunk_every{30000};
  std::chrono::milliseconds chunk_resend{10000};
  std::chrono::milliseconds join_timeout{120000};
  // true: every volunteer's steps and metrics batches start at its assignment, so the whole
  // plan's batches arrive together every second (the worst case); false: each at a random point
  // of its period, as clusters that train at their own speeds do.
  bool lockstep = false;
  // A member's 64-byte `bandwidth` probe every this long (0: none), one in flight. The coordinator
  // answers it at once, never held for a commit, so its latency is the path's alone (both sides'
  // turns, CURVE, the coordinator's queue): the metrics' latency less it is the commit's share.
  std::chrono::milliseconds echo_every{0};
};

class LoadVolunteer {
 public:
  LoadVolunteer(zmq::context_t& context, const VolunteerOptions& options, LoadRecorder& recorder,
                Clock::time_point start_at, int listen_port);
  ~LoadVolunteer();
  LoadVolunteer(const LoadVolunteer&) = delete;
  LoadVolunteer& operator=(const LoadVolunteer&) = delete;

  // Its sockets to poll (null once closed): the DEALER, the reachability ROUTERs on its port and
  // the next (a reachable provider answers on both: the second is where dial-out-only peers
  // connect, coordinator/Admissions.cpp).
  void* dealer() { return dealer_ ? static_cast<void*>(dealer_) : nullptr; }
  void* router() { return router_ ? static_cast<void*>(router_) : nullptr; }
  void* acceptRouter() { return accept_router_ ? static_cast<void*>(accept_router_) : nullptr; }
  // Reads what arrived on either socket (non-blocking).
  void readDealer(Clock::time_point now);
  void readRouter();  // both reachability ROUTERs
  // Sends what is due at `now`; returns when it next has something to do.
  Clock::time_point tick(Clock::time_point now);

  bool accepted() const { return accepted_at_.has_value(); }
  bool assigned() const { return assigned_; }
  bool failed() const { return failed_; }
  std::optional<Clock::time_point> acceptedAt() const { return accepted_at_; }
  std::optional<Clock::time_point> assignedAt() const { return assigned_at_; }

 private:
  enum class Phase { kIdle, kProbing, kJoining, kMember };
  struct PendingChunk {
    int64_t chunk = 0;
    uint64_t bytes = 0;
  };
  void start(Clock::time_point now);
  void send(const Frames& frames);
  void onMessage(const Frames& frames, Clock::time_point now);
  void onAssignment(const Assignment& a, Clock::time_point now);
  void step(Clock::time_point now);
  void sendMetrics(Clock::time_point now);
  void sendCheckpoint(Clock::time_point now);
  void requestPiece(Clock::time_point now);
  void onPiece(const Frames& frames, Clock::time_point now);
  void fail(const std::string& why);

  zmq::context_t& context_;
  const VolunteerOptions& o_;
  LoadRecorder& recorder_;
  CurveKeyPair keys_;
  zmq::socket_t dealer_, router_, accept_router_;
  int listen_port_ = 0;
  std::string advertise_;
  Phase phase_ = Phase::kIdle;
  bool assigned_ = false, failed_ = false;
  Clock::time_point start_at_, sent_probe_, sent_join_;
  std::optional<Clock::time_point> accepted_at_, assigned_at_;
  std::string name_, state_ = "waiting";
  int64_t step_ = -1;
  Clock::time_point next_beat_, next_step_, next_metrics_, next_checkpoint_, next_chunks_;
  // Metrics: records numbered from acked_ (the first not yet acknowledged) in `stream_`.
  std::string stream_;
  std::deque<nlohmann::json> records_;
  int64_t acked_ = 0;
  std::optional<Clock::time_point> metrics_sent_;
  std::optional<Clock::time_point> checkpoint_sent_;
  Clock::time_point next_echo_;
  std::optional<Clock::time_point> echo_sent_;
  void sendEcho(Clock::time_point now);
  void readReach(zmq::socket_t& router);
  // Chunks: a Root's list, the one being fetched and the piece in flight.
  std::vector<PendingChunk> chunks_;
  size_t chunk_at_ = 0;
  uint64_t offset_ = 0;
  std::optional<Clock::time_point> piece_sent_;
};

}  // namespace cairn::bench::load
