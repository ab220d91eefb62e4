// LoadWorker: one worker thread of tools/bench/coordinator_load: a zmq poll loop over the sockets
// of the simulated volunteers it owns (a few threads serve thousands of volunteers; none has a
// thread of its own). Each turn it ticks the volunteers whose next action is due, then polls their
// DEALERs and reachability ROUTERs until the earliest next action (at most 50 ms) and reads what
// arrived. Ends when Progress::stop is set.
// Ownership: the volunteers are the caller's and must outlive the thread. Thread-safety: the thread
// alone touches its volunteers and recorder until it is joined.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "tools/bench/coordinator_load/LoadVolunteer.h"

namespace cairn::bench::load {

class LoadWorker {
 public:
  explicit LoadWorker(Progress& progress) : recorder_(progress) {}
  ~LoadWorker() { join(); }
  LoadRecorder& recorder() { return recorder_; }
  void add(std::unique_ptr<LoadVolunteer> v) { volunteers_.push_back(std::move(v)); }
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  const std::vector<std::unique_ptr<LoadVolunteer>>& volunteers() const { return volunteers_; }
  // Closes every socket (after join(), before the context ends).
  void close() { volunteers_.clear(); }

 private:
  void run();
  LoadRecorder recorder_;
  std::vector<std::unique_ptr<LoadVolunteer>> volunteers_;
  std::thread thread_;
};

}  // namespace cairn::bench::load
