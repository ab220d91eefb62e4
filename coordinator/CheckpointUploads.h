// CheckpointUploads: the coordinator's side of `checkpoint` uploads (docs/PROTOCOL.md
// "Coordination"): the newest checkpoint of each placed node is kept in <out>/checkpoints/<node>/
// (a spare that takes the node over resumes from it) and acknowledged with `checkpoint_ack{name,
// step, keep_from}`.
//   onUpload()      from the loop, for an upload its speaker sent: a repeat of the held one (same
//                   step, same bytes) is acknowledged again; a resend of one being written waits
//                   for that write; anything else goes to the CheckpointWriter (off the loop)
//                   Every answer goes back on the connection the upload came on (its routing id;
//                   for a resend of one being written, the resend's). Not by the member's key: a
//                   volunteer's sockets share its key (heartbeats, metrics, uploads), and the
//                   coordinator's route for a key is that of its last message, so an ack sent after
//                   the write went to whichever socket had spoken meanwhile (a heartbeat's, which
//                   drops it), and the volunteer waited out its ack timeout, uploading nothing.
//   takeWritten()   from the loop, once the writer's readyFd() is readable: each written file's
//                   row (it replaces the held one: a node sends an older step, or the same step
//                   with other bytes, only once its cluster resumed from an earlier checkpoint, and
//                   a spare must be given the run its neighbours train now), its credit
//                   (Credit.h creditCheckpoint), the superseded file removed after the commit,
//                   and the ack (held by the Outbox until the commit)
// keep_from is the oldest of the placed nodes' newest checkpoints (0 while one has none): every
// volunteer keeps its checkpoints from this step on, so the one a spare is given is also held by
// the lost node's neighbours and their cluster resumes at its step.
// Ownership: borrows the store and the outbox; owns the writer. Thread-safety: the loop's.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>

#include "coordinator/CheckpointWriter.h"
#include "coordinator/CoordinatorStore.h"
#include "coordinator/Outbox.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

class CheckpointUploads {
 public:
  // Sends `frames` on the connection of `routing_id` (through the Outbox: held until the commit).
  using Reply = std::function<void(const std::string& routing_id, const Frames& frames)>;
  // `planned_steps`: the run's planned length (0: unknown), for the credit a checkpoint gives.
  CheckpointUploads(CoordinatorStore& store, Outbox& outbox, std::string out,
                    std::function<int64_t()> planned_steps, Reply reply);

  // `routing_id`: the connection the upload came on, where its answer goes.
  void onUpload(CheckpointUpload upload, const std::string& routing_id);
  int readyFd() const { return writer_.readyFd(); }
  // True when a row was stored (the credit changed).
  bool takeWritten();
  uint64_t refused() const { return writer_.refused(); }

 private:
  int64_t keepFrom() const;

  CoordinatorStore& store_;
  Outbox& outbox_;
  std::string out_;
  std::function<int64_t()> planned_steps_;
  Reply reply_;
  struct InHand {
    int64_t step;
    uint64_t checksum;
    std::string routing_id;  // where its answer goes
  };
  // Per node, the uploads being written, oldest first (the writer keeps order).
  std::map<std::string, std::deque<InHand>> writing_;
  CheckpointWriter writer_;  // last: its worker ends before the rest goes
};

}  // namespace cairn::coordinator
