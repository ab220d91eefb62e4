// RingBuckets: the module tensors one ring brings together (the parameters AND buffers node.json
// lists for it, dotted names as inside stage.pt), cut into buckets of one dtype and role
// (parameters / buffers) so a ring costs one all-reduce per bucket, not one per tensor; each
// bucket flattens into one 1-d tensor and back. Also the FNV-1a checksum of the ring's tensors
// (names, dtypes, shapes, bytes) that the identical-start check and the welcome carry.
// Gradient buckets ("gradients" mode): the floating parameters again, per dtype, cut into buckets
// of at most `gradient_bucket_bytes` from the last parameter back — node.json lists a ring's
// parameters in model order, so the first gradient bucket holds the last layers, whose gradients
// backward produces first (DDP's order). A tensor larger than the cap is a bucket of its own.
// Inside a bucket the tensors keep node.json's order, so a ring that fits one bucket reduces
// exactly as when every parameter of a dtype was one bucket. Every member of a ring cuts the same
// buckets (same names, shapes and cap), which is what keeps their collectives in step.
//
// Where they live: `tensors` on the stage's training device (trainer/Device.h), flattened buckets
// and the outer state on the host, where the collectives reduce them: flatten copies a bucket
// out (one copy per bucket), unflatten copies it back onto each tensor's device.
// Ownership: `tensors` alias the stage module's parameters and buffers (writing a bucket back
// writes the module); the DiLoCo outer state (θ_prev, momentum) is owned per bucket.
// Thread-safety: one thread at a time (the ring's thread during a sync).
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/NodeData.h"

namespace cairn {

struct RingBucket {
  torch::ScalarType dtype;
  bool parameters = false;
  std::vector<size_t> members;  // indices into RingBuckets::tensors
  int64_t numel = 0;
  torch::Tensor previous;  // diloco: θ_prev, flat
  torch::Tensor momentum;  // diloco: outer momentum buffer, flat (undefined before the first)
};

struct RingBuckets {
  std::vector<torch::Tensor> tensors;  // alias the stage module's parameters and buffers
  std::vector<bool> is_parameter;
  std::vector<RingBucket> buckets;
  // "gradients" mode (see above); 0: one gradient bucket per dtype. Set before build().
  int64_t gradient_bucket_bytes = 0;
  std::vector<RingBucket> gradient_buckets;  // in all-reduce order; indices into tensors

  // Collects `names` from `stage` (BadInput naming `node`'s node.json and `stage_file` for a name
  // the module has neither as a parameter nor as a buffer). With `diloco`, floating parameter
  // buckets start their θ_prev from the stage. Also cuts the gradient buckets.
  void build(const std::vector<std::string>& names, torch::jit::Module& stage,
             const std::string& node, const std::string& ring_id, const std::string& stage_file,
             bool diloco);
  // The bucket's tensors (or their gradients, zeros for a tensor without one), flat, in order, on
  // the host.
  torch::Tensor flatten(const RingBucket& b, bool gradients) const;
  // The same, flat where the tensors live (the training device): what GradientOverlap copies out
  // to the host itself, without waiting, while backward still runs.
  torch::Tensor flattenInPlace(const RingBucket& b, bool gradients) const;
  // Writes `flat` back into the bucket's tensors (or their gradients).
  void unflatten(const RingBucket& b, const torch::Tensor& flat, bool gradients);
  // FNV-1a of names (`names[i]` for tensors[i]), dtypes, shapes and bytes.
  uint64_t checksum(const std::vector<std::string>& names) const;
  // The same over the same fields, the tensors' bytes hashed 8 at a time (fnv1aWords): the result
  // of every average is hashed (RingSyncMath.h checkContributions), so it must be cheap.
  uint64_t resultChecksum(const std::vector<std::string>& names) const;
  // DiLoCo: FNV-1a (8 bytes at a time) of every bucket's θ_prev and momentum (where defined, in
  // bucket order, each with its bucket index and which of the two it is); kFnvOffset when none.
  uint64_t outerStateChecksum() const;
};

}  // namespace cairn
