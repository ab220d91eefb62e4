// CheckpointWriter: checkpoint uploads written to disk off the coordinator's loop (issue [Q]: a
// 1 MiB file and its fsync per upload held the loop, and every heartbeat and metrics batch behind
// it, for milliseconds each; 1,000 volunteers upload ~33 a second). The loop submit()s an upload
// with the path it goes to; one worker thread writes each file durably (writeFileDurably: a
// temporary file, fsync, rename) in the order submitted, and the loop takes the finished ones with
// done() when readyFd() is readable, then stores their rows and acknowledges them (Coordinator.cpp
// onCheckpointWritten): a row never names a file that is not complete, and no volunteer hears of a
// checkpoint before its file and row are durable.
// The worker also checks each upload against its checksum (FNV-1a over the whole file, which held
// the loop for as long as the decoder did it: ~1 ms a MiB, hundreds for a large model's stage), so
// the loop decodes uploads with AttachmentChecksum::kLeaveToReceiver; a corrupt one is not written.
// Bounded: at most `max_pending_bytes` of files wait (an upload past that is refused, counted and
// unacknowledged: the volunteer sends its newest again after its ack timeout, VolunteerCheckpoints.h).
// Ownership: owns the worker and its eventfd. Thread-safety: submit, readyFd, done and the counts
// from the loop's thread only; files are written on the worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cairn::coordinator {

struct CheckpointFile {
  std::string name;  // the node
  int64_t step = 0;
  uint64_t checksum = 0;
  std::string path;   // where it goes
  std::string bytes;  // the file (emptied once written)
  std::string error;  // set by the worker when it could not be written
  bool corrupt = false;  // its bytes do not match `checksum` (set by the worker: not written)
  size_t size = 0;    // its size (set when it is submitted)
};

class CheckpointWriter {
 public:
  static constexpr size_t kDefaultMaxPendingBytes = size_t(512) << 20;
  explicit CheckpointWriter(size_t max_pending_bytes = kDefaultMaxPendingBytes);
  ~CheckpointWriter();  // ends the worker once the file in hand is written; waiting ones are dropped
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues `file`; false (and counted) when the files waiting already hold max_pending_bytes.
  bool submit(CheckpointFile file);
  int readyFd() const { return event_fd_; }  // readable while written files wait for done()
  std::vector<CheckpointFile> done();        // the written (or failed) files, in submission order
  size_t waiting() const;                    // submitted, not yet taken by done()
  uint64_t refused() const { return refused_; }

 private:
  void run();

  const size_t max_pending_bytes_;
  int event_fd_ = -1;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<CheckpointFile> queue_, written_;  // under mutex_
  size_t pending_bytes_ = 0;                    // under mutex_: queued and in hand
  bool in_hand_ = false;                        // under mutex_
  bool stop_ = false;                           // under mutex_
  uint64_t refused_ = 0;                        // the loop's
  std::thread worker_;
};

}  // namespace cairn::coordinator
