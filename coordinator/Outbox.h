// Outbox: the coordinator's group commit. The loop opens a batch of store writes (one SQLite
// transaction: CoordinatorStore::beginBatch) before it handles a message and commits it when the
// ROUTER's queue is empty or 10 ms after it began, so a stream of heartbeats and metrics costs one
// fsync per batch instead of one per message (1,000 volunteers send ~1,500 a second). What the
// batch's writes acknowledge must not reach a volunteer before they are durable, so:
//   send()              a reply, held while a batch is open (sent at once otherwise)
//   removeAfterCommit() a file the batch's rows stop naming (a superseded checkpoint): removed
//                       once the rows that name its successor are committed, unless `keep` says
//                       then that it is wanted again
//   commit()            commits the batch, removes those files, then sends the held replies in
//                       the order they were given
// A coordinator killed before a commit has told nobody anything the restarted one does not know.
// Ownership: borrows the store; `deliver` puts a reply on the wire. Thread-safety: the loop's.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "node/volunteer/CoordinationSocket.h"

namespace cairn::coordinator {

class Outbox {
 public:
  using Clock = std::chrono::steady_clock;
  using Deliver = std::function<void(const std::string& routing_id, const Frames& frames)>;
  Outbox(CoordinatorStore& store, Deliver deliver) : store_(store), deliver_(std::move(deliver)) {}

  void begin();  // no-op while a batch is open
  bool open() const { return store_.batchOpen(); }
  Clock::time_point began() const { return began_; }
  void send(const std::string& routing_id, const Frames& frames);
  void removeAfterCommit(std::string path, std::function<bool()> keep = {}) {
    superseded_.emplace_back(std::move(path), std::move(keep));
  }
  void commit();
  size_t held() const { return held_.size(); }

 private:
  CoordinatorStore& store_;
  Deliver deliver_;
  Clock::time_point began_;
  std::vector<std::pair<std::string, Frames>> held_;  // routing id, frames
  std::vector<std::pair<std::string, std::function<bool()>>> superseded_;
};

}  // namespace cairn::coordinator
