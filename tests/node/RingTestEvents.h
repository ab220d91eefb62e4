// Events between the node threads of the ring tests (RingWelcomeTest, RingGatedAdmissionTest):
// each ordering is made by an event, never by a sleep.
#pragma once

#include <condition_variable>
#include <mutex>

namespace cairn::testing {

// One-shot event between two node threads.
class Event {
 public:
  void set() {
    std::lock_guard<std::mutex> lock(mutex_);
    set_ = true;
    changed_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool set_ = false;
};

// Sets `event` when the scope ends, however it ends (a failed start() must still release a).
struct SetOnExit {
  Event& event;
  ~SetOnExit() { event.set(); }
};

}  // namespace cairn::testing
