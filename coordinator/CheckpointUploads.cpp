#include "coordinator/CheckpointUploads.h"

#include "coordinator/Credit.h"
#include "core/Log.h"

namespace cairn::coordinator {

CheckpointUploads::CheckpointUploads(CoordinatorStore& store, Outbox& outbox, std::string out,
                                     std::function<int64_t()> planned_steps, Reply reply)
    : store_(store),
      outbox_(outbox),
      out_(std::move(out)),
      planned_steps_(std::move(planned_steps)),
      reply_(std::move(reply)) {}

int64_t CheckpointUploads::keepFrom() const {
  return std::max<int64_t>(store_.oldestNewestCheckpointOfPlaced().value_or(0), 0);
}

void CheckpointUploads::onUpload(CheckpointUpload c, const std::string& routing_id) {
  auto in_hand = writing_.find(c.name);
  if (in_hand != writing_.end() && !in_hand->second.empty()) {
    InHand& newest = in_hand->second.back();
    if (newest.step == c.step && newest.checksum == c.checksum) {
      newest.routing_id = routing_id;  // a resend of the newest being written: acked after it, here
      return;
    }
  } else if (const auto held = store_.checkpoint(c.name); held && held->step == c.step &&
                                                         held->checksum == c.checksum) {
    if (store_.memberByName(c.name))  // a repeat: nothing changes
      reply_(routing_id, encode(CheckpointAck{c.name, held->step, keepFrom()}));
    return;
  }
  CheckpointFile file;
  file.name = c.name;
  file.step = c.step;
  file.checksum = c.checksum;
  file.path = out_ + "/checkpoints/" + c.name + "/step_" + std::to_string(c.step) + ".ckpt";
  file.bytes = std::move(c.file);
  if (writer_.submit(std::move(file))) writing_[c.name].push_back({c.step, c.checksum, routing_id});
}

bool CheckpointUploads::takeWritten() {
  bool stored = false;
  for (CheckpointFile& f : writer_.done()) {
    auto& in_hand = writing_[f.name];
    std::string route;
    if (!in_hand.empty()) {
      route = std::move(in_hand.front().routing_id);
      in_hand.pop_front();
    }
    if (in_hand.empty()) writing_.erase(f.name);
    if (f.corrupt) {  // as the decoder would have said (AttachmentChecksum, CheckpointWriter.h)
      CAIRN_WARN("coordinator: dropped the checkpoint of ", f.name, " at step ", f.step, ": ", f.error);
      if (store_.memberByName(f.name) && !route.empty())
        reply_(route, encode(Rejected{"malformed message: checkpoint: " + f.error}));
      continue;
    }
    if (!f.error.empty()) {
      CAIRN_WARN("coordinator: the checkpoint of ", f.name, " at step ", f.step, " could not be "
                 "written (", f.error, "); not acknowledged: its volunteer sends it again");
      continue;
    }
    const auto previous = store_.checkpoint(f.name);
    if (previous && previous->step >= f.step)
      CAIRN_INFO("coordinator: ", f.name, "'s checkpoint of step ", previous->step,
                 " is replaced by one of step ", f.step, " (its cluster resumed from an earlier step)");
    store_.putCheckpoint({f.name, f.step, f.path, f.checksum});
    stored = true;
    const auto m = store_.memberByName(f.name);
    if (m) creditCheckpoint(store_, m->public_key, f.name, f.step, planned_steps_());
    // The committed row names the old file until the batch is committed: removed then, unless
    // another upload of the node is being written meanwhile (it may be going to that very path:
    // an old file left behind is only space, and the next write supersedes it).
    if (previous && previous->path != f.path)
      outbox_.removeAfterCommit(previous->path, [this, name = f.name] { return writing_.count(name) > 0; });
    if (m && !route.empty()) reply_(route, encode(CheckpointAck{f.name, f.step, keepFrom()}));
    CAIRN_INFO("coordinator: checkpoint of ", f.name, " at step ", f.step, " (", f.size, " bytes)");
  }
  return stored;
}

}  // namespace cairn::coordinator
