#include "node/volunteer/MetricsQueue.h"

#include <algorithm>

#include "core/Error.h"

namespace cairn {

MetricsQueue::MetricsQueue(size_t capacity, size_t max_line_bytes)
    : capacity_(capacity), max_line_bytes_(max_line_bytes) {
  CAIRN_ENFORCE(capacity_ > 0, "MetricsQueue needs a capacity > 0");
}

int64_t MetricsQueue::push(std::string line) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t seq = next_seq_++;
  if (line.size() > max_line_bytes_) {
    ++dropped_;
    return seq;
  }
  if (records_.size() >= capacity_) {
    records_.pop_front();
    ++dropped_;
  }
  records_.push_back(QueuedRecord{seq, std::move(line)});
  return seq;
}

std::vector<QueuedRecord> MetricsQueue::peek(size_t max_records, size_t max_bytes) const {
  std::vector<QueuedRecord> out;
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bytes = 0;
  for (const QueuedRecord& r : records_) {
    if (out.size() >= max_records) break;
    if (!out.empty() && bytes + r.line.size() > max_bytes) break;
    bytes += r.line.size();
    out.push_back(r);
  }
  return out;
}

void MetricsQueue::acknowledge(int64_t next_seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!records_.empty() && records_.front().seq < next_seq) records_.pop_front();
}

size_t MetricsQueue::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_.size();
}
int64_t MetricsQueue::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}
int64_t MetricsQueue::nextSeq() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_seq_;
}
int64_t MetricsQueue::frontSeq() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_.empty() ? next_seq_ : records_.front().seq;
}

}  // namespace cairn
