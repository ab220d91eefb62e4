// VolunteerCheckpoints: while a volunteer trains, a background thread uploads its newest valid
// checkpoint to the coordinator (docs/OPERATIONS.md "Volunteers join", docs/PROTOCOL.md
// "Coordination": `checkpoint{name, step, checksum}` + the file, answered by `checkpoint_ack`).
// Every `poll` it lists <checkpoint_dir>/step_<N>.ckpt (the trainer's files, trainer/Checkpoint.h),
// takes the newest one that verifies (readCheckpoint) and is not the one the coordinator already
// acknowledged, reads it and sends it on its own DEALER socket (node/volunteer/VolunteerSockets.h,
// ZMQ_IMMEDIATE, one message queued at most). The training thread does nothing for this.
//   Rate limit: after sending B bytes nothing more is sent for B*8/(upload_mbps*1e6) s.
//   At most one checkpoint in flight: the next is sent after the `checkpoint_ack` (or after
//   `ack_timeout` without one); checkpoints that appeared meanwhile are skipped but the newest.
//   Coordinator down: the send is refused at once (nothing queued); the newest is tried again at
//   the next poll. Connection closed with a checkpoint unacknowledged (a coordinator killed or
//   restarted mid-upload: what it got dies with it): the newest is offered again at the next poll,
//   without waiting out `ack_timeout` (a socket monitor on the upload socket says so).
// One log line per acknowledged upload: step, bytes, seconds from send to acknowledgement.
// keepFrom(): the acknowledgement's keep_from (-1 until one says it): the trainer keeps every
// local checkpoint from that step on, so whichever node is lost, the checkpoint the coordinator
// gives its spare is also held by its neighbours and the cluster resumes there.
//
// Ownership: owns its thread and socket; `context` is borrowed and must outlive it.
// Thread-safety: construct, finish()/stop() and read the counters from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/protocol/Coordination.h"

namespace cairn {

struct CheckpointUploadOptions {
  double upload_mbps = 50;  // > 0 (0, "uploads off", means: make no VolunteerCheckpoints)
  std::chrono::milliseconds poll{2000};
  std::chrono::milliseconds ack_timeout{60000};  // after the transfer time at upload_mbps
  size_t max_message_bytes = size_t(1) << 20;    // largest message taken from the coordinator
};

class VolunteerCheckpoints {
 public:
  VolunteerCheckpoints(zmq::context_t& context, const CurveKeyPair& own, const Invite& invite,
                       std::string name, std::string checkpoint_dir, CheckpointUploadOptions options);
  ~VolunteerCheckpoints();  // stop()
  VolunteerCheckpoints(const VolunteerCheckpoints&) = delete;
  VolunteerCheckpoints& operator=(const VolunteerCheckpoints&) = delete;

  // After training: one last look for a checkpoint the coordinator does not hold yet, sent (the
  // rate limit still holds) and acknowledged within `timeout`; then the thread ends.
  void finish(std::chrono::milliseconds timeout);
  // Stops the thread (within about 100 ms) and closes the socket.
  void stop();

  uint64_t sent() const { return sent_.load(); }          // checkpoints sent
  uint64_t bytesSent() const { return bytes_sent_.load(); }
  int64_t acknowledgedStep() const { return acked_step_.load(); }  // -1: none yet
  int64_t keepFrom() const { return keep_from_.load(); }  // any thread; -1: not said yet

 private:
  struct FileId {
    int64_t step = -1;
    uint64_t inode = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileId& o) const {
      return step == o.step && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  void run();
  // The newest verified checkpoint not yet acknowledged, read whole; false when there is none.
  bool newest(FileId* id, std::string* bytes);
  void readReplies(std::chrono::milliseconds wait);
  // The monitor's DISCONNECTED events: true when the connection closed since the last call.
  bool connectionClosed();

  zmq::socket_t socket_;
  zmq::socket_t monitor_;  // ZMQ_EVENT_DISCONNECTED of socket_
  std::string coordinator_;  // for log lines
  std::string name_, dir_;
  CheckpointUploadOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> finish_by_ns_{0};  // steady_clock deadline of finish(); 0: not finishing
  std::atomic<uint64_t> sent_{0}, bytes_sent_{0};
  std::atomic<int64_t> acked_step_{-1};
  std::atomic<int64_t> keep_from_{-1};
  // Thread-owned state.
  FileId acked_, in_flight_, last_bad_;
  bool has_in_flight_ = false;
  std::chrono::steady_clock::time_point sent_at_;
  std::thread thread_;
};

}  // namespace cairn
