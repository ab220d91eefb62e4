#include "node/protocol/SubProtocols.h"

namespace cairn {

const std::vector<SubProtocol>& subProtocols() {
  static const std::vector<SubProtocol> table = {
      {"pipeline hello", MessageKind::kControl, "tag hello", "node/protocol/PipelineControl.h",
       "start-up handshake between neighbours; mid-run, the sender restarted"},
      {"pipeline leaving", MessageKind::kControl, "tag leaving", "node/protocol/PipelineControl.h",
       "the sender stops taking part (stopped, paused, ...) and names the node lost first"},
      {"pipeline checkpoint steps", MessageKind::kControl, "tag ckpt_steps",
       "node/protocol/PipelineControl.h", "resume agreement, downstream to upstream: steps held"},
      {"pipeline resume at", MessageKind::kControl, "tag resume_at",
       "node/protocol/PipelineControl.h", "resume agreement, the Root's decision: the step"},
      {"collective chunk", MessageKind::kCollective, "tag coll:<group>, mb < 2^64-3",
       "node/collectives/CollectiveChannel.h", "one 1-d tensor of a collective operation, mb = its index"},
      {"collective abort", MessageKind::kCollective, "tag coll:<group>, mb 2^64-1",
       "node/protocol/CollectiveNotices.h", "an operation failed: txt names the lost member"},
      {"collective keep-alive", MessageKind::kCollective, "tag coll:<group>, mb 2^64-2",
       "node/protocol/CollectiveNotices.h", "the sender is alive and waits for the member in txt"},
      {"collective leave", MessageKind::kCollective, "tag coll:<group>, mb 2^64-3",
       "node/protocol/CollectiveNotices.h", "the member in txt left the group"},
      {"ring join request", MessageKind::kCollective, "tag ring:<ring>, txt type \"join\"",
       "node/protocol/RingJoin.h", "a (re)starting node asks a ring member to admit it"},
      {"ring welcome", MessageKind::kCollective, "tag ring:<ring>, txt type \"welcome\"",
       "node/protocol/RingJoin.h", "a joiner's view, generation and the ring's tensors"},
      {"ring closed", MessageKind::kCollective, "tag ring:<ring>, txt type \"closed\"",
       "node/protocol/RingJoin.h",
       "a member that finished its run will not admit the joiner's life L"},
      {"coordination", std::nullopt, "own CurveZMQ connection, JSON \"type\" (frame 0)",
       "node/protocol/Coordination.h",
       "volunteers and the coordinator: join, heartbeats, assignments, results, reachability"},
      {"served chunks", std::nullopt, "own CurveZMQ connection, JSON \"type\" chunk_*",
       "node/protocol/ChunkMessages.h", "a Root fetches its cluster's data chunks from the coordinator"},
  };
  return table;
}

}  // namespace cairn
