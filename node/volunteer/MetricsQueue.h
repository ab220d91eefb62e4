// MetricsQueue: the bounded in-memory queue between a volunteer's trainer thread and the thread
// that streams its records to the coordinator (node/volunteer/VolunteerMetrics.h). Each record is a JSON
// line and gets the next number of the stream (0, 1, 2, …). push() never waits for anything but
// this queue's own lock, held for a deque push (and a pop when full): when the queue holds
// `capacity` records the oldest is dropped and counted, so a coordinator that is slow or down
// never slows a step. Records leave the queue only when the coordinator has acknowledged them
// (acknowledge()), so a batch lost in flight is sent again.
//
// Ownership: owns the lines. Thread-safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace cairn {

struct QueuedRecord {
  int64_t seq = 0;
  std::string line;
};

class MetricsQueue {
 public:
  // `max_line_bytes`: a longer line is dropped (counted) instead of queued.
  explicit MetricsQueue(size_t capacity, size_t max_line_bytes = size_t(64) << 10);

  // Numbers and queues `line`; when full, drops the oldest record first. Returns its number.
  int64_t push(std::string line);
  // Copies of the oldest records, at most `max_records` and `max_bytes` of lines in total (at
  // least one record when any is queued). They stay queued until acknowledged.
  std::vector<QueuedRecord> peek(size_t max_records, size_t max_bytes) const;
  // Removes every record numbered below `next_seq` (the coordinator holds them).
  void acknowledge(int64_t next_seq);

  size_t size() const;
  int64_t dropped() const;   // records dropped because the queue was full (or a line too long)
  int64_t nextSeq() const;   // the number the next push() gets = records pushed so far
  // The number of the oldest queued record (nextSeq() when empty).
  int64_t frontSeq() const;

 private:
  mutable std::mutex mutex_;
  std::deque<QueuedRecord> records_;
  size_t capacity_, max_line_bytes_;
  int64_t next_seq_ = 0, dropped_ = 0;
};

}  // namespace cairn
