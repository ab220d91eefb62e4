// ChunkService: chunk requests answered off the coordinator's loop (issue [Q]: joins, heartbeats,
// metrics and checkpoint uploads must not wait while pieces of a big shard are read). The loop
// hands each chunk_request to submit() with the job that answers it (ChunkServer.h
// serveChunkRequest: one pread of one piece); one worker thread runs the jobs in order and pushes
// each answer, with the routing id it goes to, through an inproc PUSH socket. ZeroMQ sockets are
// not thread-safe, so only the loop touches its ROUTER: it polls ready() beside the ROUTER and
// forward()s what is there. Bounded: at most `max_pending` requests wait (one more is dropped
// unanswered and counted: the fetcher asks again after its backoff, ChunkFetcher.h), and at most
// kReadyAnswers answers wait in the pipe (the worker waits for room), so the memory held is a few
// pieces whatever the number of askers.
// Ownership: owns the worker thread and both ends of the pipe. Thread-safety: submit, ready,
// forward and the counts from the loop's thread only; jobs run on the worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

class ChunkService {
 public:
  static constexpr size_t kDefaultMaxPending = 64;
  static constexpr int kReadyAnswers = 8;

  using Job = std::function<Frames()>;
  ChunkService(zmq::context_t& context, size_t max_pending = kDefaultMaxPending);
  ~ChunkService();  // ends the worker once its job in hand is done; waiting jobs are dropped
  ChunkService(const ChunkService&) = delete;
  ChunkService& operator=(const ChunkService&) = delete;

  // Queues `job`, whose answer goes to `routing_id`; false (and counted) when max_pending wait.
  bool submit(std::string routing_id, Job job);
  // The loop's end of the pipe: readable when an answer is ready.
  zmq::socket_t& ready() { return pull_; }
  // Sends every answer ready through `send(routing_id, frames)`, without waiting; how many.
  size_t forward(const std::function<void(const std::string&, const Frames&)>& send);

  uint64_t dropped() const { return dropped_; }
  uint64_t answered() const { return answered_; }

 private:
  void run();

  const size_t max_pending_;
  std::string endpoint_;
  zmq::socket_t pull_, push_;  // pull_: the loop's; push_: the worker's
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::string, Job>> jobs_;  // under mutex_
  bool stop_ = false;                             // under mutex_
  uint64_t dropped_ = 0, answered_ = 0;           // the loop's
  std::thread worker_;
};

}  // namespace cairn::coordinator
