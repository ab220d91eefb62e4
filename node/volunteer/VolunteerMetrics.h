// VolunteerMetrics: while a volunteer trains (`provider --join`), its trainer's records — every
// metrics.jsonl line (steps, evaluations, checkpoints, the end), the run plan, and the node's state
// changes (paused, resumed, stopped, lost-peer, failed, finished) — go to the coordinator in the
// background (docs/PROTOCOL.md "Coordination": `metrics` answered by `metrics_ack`).
//
// The trainer's thread only pushes a line into a bounded MetricsQueue (drop-oldest, counted;
// docs/OPERATIONS.md "Watching a run" gives the measured cost per step). A thread of its own, on
// its own DEALER socket (node/volunteer/VolunteerSockets.h, ZMQ_IMMEDIATE, one message queued at most),
// sends the oldest records in a batch `metrics{name, stream, seq, records, dropped}` every
// `interval` (at once when a batch is full), one batch in flight; the coordinator answers
// `metrics_ack{seq}` and only then are those records removed from the queue. No answer within
// `ack_timeout` (the coordinator was down or restarted): the same records are sent again, and the
// coordinator skips the ones it holds (by stream and number), so a restarted coordinator loses no
// record the queue still held. A coordinator that is down refuses the send at once; records wait
// in the queue (up to its bound) until it is back.
//
// It also holds what the heartbeats report (VolunteerHeartbeats): the node's state and its last
// step.
//
// Ownership: owns its thread, socket and queue; `context` is borrowed and must outlive it.
// Thread-safety: record() and event() from the trainer's thread (or any one thread); progress()
// from any thread; construct, finish()/stop() and read counters from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/volunteer/MetricsQueue.h"
#include "node/protocol/Coordination.h"

namespace cairn {

struct MetricsStreamOptions {
  size_t capacity = 20000;                       // records held while the coordinator is away
  std::chrono::milliseconds interval{1000};      // a batch at least this often (when any)
  size_t batch_records = 1000;                   // at most this many records per message …
  size_t batch_bytes = size_t(512) << 10;        // … and this many bytes of lines
  std::chrono::milliseconds ack_timeout{5000};   // no metrics_ack: send again
  size_t max_message_bytes = size_t(1) << 20;    // largest message taken from the coordinator
};

class VolunteerMetrics {
 public:
  VolunteerMetrics(zmq::context_t& context, const CurveKeyPair& own, const Invite& invite,
                   std::string name, MetricsStreamOptions options = {});
  ~VolunteerMetrics();  // stop()
  VolunteerMetrics(const VolunteerMetrics&) = delete;
  VolunteerMetrics& operator=(const VolunteerMetrics&) = delete;

  // A metrics.jsonl record and its line (MetricsLog's tee): queued; a step record's "step" is the
  // heartbeats' step.
  void record(const nlohmann::json& record, const std::string& line);
  // A plan or state event (ProviderRunOptions::on_event): stamped with "t" (unix seconds) and
  // queued; a "state" becomes the heartbeats' state.
  void event(nlohmann::json event);
  // The state and step the heartbeats carry ("training", -1 before the first step).
  std::pair<std::string, int64_t> progress() const;

  // After training: sends until every queued record is acknowledged or `timeout` passed; then the
  // thread ends. Returns true when everything was acknowledged.
  bool finish(std::chrono::milliseconds timeout);
  // Stops the thread (within about 100 ms) and closes the socket.
  void stop();

  const std::string& stream() const { return stream_; }
  const MetricsQueue& queue() const { return queue_; }
  uint64_t batchesSent() const { return batches_sent_.load(); }
  int64_t acknowledged() const { return acked_seq_.load(); }  // records before this are held

 private:
  void run();
  void readReplies(std::chrono::milliseconds wait);

  zmq::socket_t socket_;
  std::string coordinator_;  // for log lines
  std::string name_, stream_;
  MetricsStreamOptions options_;
  MetricsQueue queue_;
  mutable std::mutex state_mutex_;
  std::string state_ = "training";
  std::atomic<int64_t> step_{-1};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> finish_by_ns_{0};  // steady_clock deadline of finish(); 0: not finishing
  std::atomic<uint64_t> batches_sent_{0};
  std::atomic<int64_t> acked_seq_{0};
  std::atomic<bool> all_acked_{false};
  // Thread-owned.
  bool in_flight_ = false;
  int64_t in_flight_end_ = 0;
  std::chrono::steady_clock::time_point sent_at_;
  std::thread thread_;
};

}  // namespace cairn
