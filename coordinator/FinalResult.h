// FinalResult: the result of a placed node lost after it finished training but before its result
// reached the coordinator (it died, froze or was cut off between its final checkpoint's upload and
// its result's; docs/OPERATIONS.md "Lost after finishing"). Giving such a node to a spare cannot
// help: the spare would resume at the last step and wait for neighbours that have finished and
// gone. Its final checkpoint holds exactly the weights it would have sent, so its result is made
// from it: the node's stage file with the checkpoint's parameters and buffers
// (trainer/Checkpoint.h loadStageWeights), and a summary that says so ("from_checkpoint": the
// step). The node's own evaluation (a Leaf's final test loss and accuracy) is not in it.
// A checkpoint is final when its step reaches the run plan's total_steps written in its meta.
// Thread-safety: pure functions of the files they read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "coordinator/CoordinatorStore.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

// The result `name` would have uploaded, from `checkpoint` (the newest the coordinator holds for
// it) and the stage file in <out>/nodes/<name>/; nullopt when that checkpoint is not final. A
// final checkpoint that cannot be read or does not fit the stage: BadInput naming the file.
std::optional<ResultUpload> resultFromFinalCheckpoint(const std::string& out, const std::string& name,
                                                      const StoredCheckpoint& checkpoint);

// What the coordinator asks for every lost node (MemberReplacer::onLostAfterFinishing, on each
// poll while it waits for a spare): its result from `held` when that checkpoint is final (logged),
// else nullopt. A checkpoint found not final, or unusable (logged once), is not read again until
// a newer one is held. Thread-safety: the coordinator's loop thread only.
class FinalResults {
 public:
  std::optional<ResultUpload> take(const std::string& out, const std::string& name,
                                   const std::optional<StoredCheckpoint>& held);

 private:
  std::map<std::string, int64_t> not_final_;  // node → the step of its checkpoint found not final
};

}  // namespace cairn::coordinator
