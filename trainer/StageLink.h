// StageLink: a stage's two pipeline neighbours as the trainer sees them. trainer/ has no socket
// code: node/ implements this over its Mailbox and transport (MailboxStageLink), tests implement it
// with in-memory queues between threads. Every receive waits at most the peer timeout and then
// throws PeerLost naming the neighbour and what was awaited; send throws PeerLost when the
// neighbour's queue stays full for that long.
// Thread-safety: called by the one thread that owns the node (docs/THREADS.md).
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/TrainOptions.h"

namespace cairn {

enum class Neighbour { kUpstream, kDownstream };
enum class PacketKind { kActivation, kGradient, kEvaluation, kControl };
const char* toString(Neighbour neighbour);
const char* toString(PacketKind kind);

struct StagePacket {
  PacketKind kind = PacketKind::kControl;
  uint64_t step = 0;
  uint64_t microbatch = 0;
  std::string tag;   // control packets: what this is ("plan", "norm_partial", ...)
  std::string text;  // control packets: JSON
  std::vector<std::pair<std::string, torch::Tensor>> tensors;

  // The tensor named `name`; BadInput naming the packet when it is missing.
  const torch::Tensor& tensor(const std::string& name) const;
  bool has(const std::string& name) const;
};

// Whether tensor `t` named `name` of a `kind` packet is what training_definition.wire.activations
// compresses: a float32 tensor of an activation, gradient or evaluation packet, never a reserved
// one (targets, ids, the loss share, ...). The one rule for the link's codec on the host
// (node/pipeline/MailboxStageLink) and the cast on the device before the crossing (TimedLink).
bool wireCompresses(PacketKind kind, const std::string& name, const torch::Tensor& t);
// The dtype a compressed tensor travels in under `wire` (kChar for int8: the rows with scales of
// trainer/Int8Boundary.h; kFloat for fp32: not compressed).
torch::ScalarType wireFloat(WireCodec wire);
// The wire form of `t` under `wire_float` (wireFloat) when the wire compresses it (wireCompresses),
// computed where `t` is: kBFloat16 or kHalf a cast, kChar the int8 rows with scales for 2 or more
// dimensions (fewer stay float32). std::nullopt: it travels as it is. The one encoder of the
// link on the host (MailboxStageLink) and of a GPU stage before the crossing (TimedLink).
std::optional<torch::Tensor> wireForm(torch::ScalarType wire_float, PacketKind kind,
                                      const std::string& name, const torch::Tensor& t);

class StageLink {
 public:
  virtual ~StageLink() = default;
  virtual void send(Neighbour to, const StagePacket& packet) = 0;
  // The packet of `kind` for (step, microbatch, tag) from that neighbour; others wait their turn.
  virtual StagePacket receive(Neighbour from, PacketKind kind, uint64_t step, uint64_t microbatch,
                              const std::string& tag) = 0;
  // The packet receive() would return now, if it has arrived already: taken without waiting.
  // nullopt when it has not, or when something must be handled first (a message to drop, a
  // neighbour's recovery): receive() then does, as always. TimedLink asks this before it sends
  // what it holds back (trainer/TrainerContext.h). By default: never known to be here.
  virtual std::optional<StagePacket> tryReceive(Neighbour /*from*/, PacketKind /*kind*/,
                                                uint64_t /*step*/, uint64_t /*microbatch*/,
                                                const std::string& /*tag*/) {
    return std::nullopt;
  }
  // Bytes this node has sent so far over whatever carries the link (its neighbours and, on the
  // same transport, its rings); the step records' "sent_bytes" are its differences. 0: not known.
  virtual uint64_t bytesSent() const { return 0; }
};

}  // namespace cairn
