// LoadRecorder: what one worker thread of tools/bench/coordinator_load saw — messages sent to the
// coordinator by type, replies received, reply latencies (request → its answer) — kept per
// measurement window (0: the joins and the plan; 1 and 2: the two measured windows the main thread
// switches to). Progress (accepted, assigned, failed) is shared by all threads as atomics so the
// main thread can wait on it.
// Ownership: plain values. Thread-safety: a LoadRecorder belongs to one worker thread and is read
// by the main thread only after that thread ended; Progress is atomic.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace cairn::bench::load {

// kEcho: a member's small `bandwidth` probe (--echo-ms), answered at once, never held for a commit.
enum class Msg { kProbe, kJoin, kHeartbeat, kMetrics, kCheckpoint, kChunk, kEcho };
constexpr int kMsgTypes = 7;
constexpr int kWindows = 3;
const char* msgName(Msg m);

struct Progress {
  std::atomic<int> window{0};  // where the workers record now
  std::atomic<int> accepted{0}, assigned{0}, failed{0}, rejected{0};
  std::atomic<bool> stop{false};
};

struct WindowCounts {
  std::array<uint64_t, kMsgTypes> sent{};
  std::array<std::vector<float>, kMsgTypes> latency_ms;  // one per answered request
  uint64_t sent_bytes = 0;
  uint64_t replies = 0;
  uint64_t resends = 0;  // a request sent again after no answer within its timeout
};

class LoadRecorder {
 public:
  explicit LoadRecorder(Progress& progress) : progress_(progress) {}
  Progress& progress() { return progress_; }
  void sent(Msg m, size_t bytes) {
    WindowCounts& w = now();
    ++w.sent[size_t(m)];
    w.sent_bytes += bytes;
  }
  void latency(Msg m, std::chrono::steady_clock::duration d) {
    now().latency_ms[size_t(m)].push_back(
        float(std::chrono::duration<double, std::milli>(d).count()));
  }
  void reply() { ++now().replies; }
  void resend() { ++now().resends; }
  void problem(const std::string& what);  // counted; the first few are printed
  const std::array<WindowCounts, kWindows>& windows() const { return windows_; }
  uint64_t problems() const { return problems_; }

 private:
  WindowCounts& now() { return windows_[size_t(progress_.window.load(std::memory_order_relaxed))]; }
  Progress& progress_;
  std::array<WindowCounts, kWindows> windows_;
  uint64_t problems_ = 0;
};

}  // namespace cairn::bench::load
