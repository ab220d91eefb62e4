// training_definition.wire.activations "int8": how a planned float32 boundary tensor (an
// activation, its gradient, an evaluation batch) travels between stages — one byte per value and
// one fp32 scale per row, a quarter of the bytes plus the scales (docs/PROTOCOL.md "Compressed
// tensors"). Rounding is core/WireCompression.h's encodeInt8Rows, bit for bit (the unit test
// holds it to that scalar reference); this is its vectorised libtorch form, with the rows laid
// out so the wire shape still names the tensor's shape.
//
// Rows: for a tensor [B, F] a row is one sample's F values; for [B, C, d2, …] (dim ≥ 3) a row is
// the d2·d3·… values of one (sample, channel) pair — per-token scales for [B, T, E], per-channel
// scales for a convolution's [B, C, H, W]. Tensors with fewer than 2 dimensions stay float32.
// Wire form: uint8 [B, cols + 4] (dim 2) or [B, C, cols + 4] (dim ≥ 3); each row is its fp32
// scale (little-endian, scale = max|x| / 127) followed by its cols int8 values (q = x / scale
// rounded half to even, −127…127; an all-zero row has scale 0). A row holding NaN or Inf has a
// NaN scale and zeros: it decodes to NaN, so the receiver's `nonfinite` policy sees it.
#pragma once

#include <torch/script.h>

#include <string>
#include <vector>

namespace cairn {

// Whether a float32 tensor of this many dimensions travels as int8 rows (dim ≥ 2).
bool int8Carries(int64_t dim);
// The wire shape of a float32 tensor of `shape` (int8Carries(shape.size())).
std::vector<int64_t> int8WireShape(at::IntArrayRef shape);
// float32 → wire form (uint8, int8WireShape(x.sizes())), computed on x's device (a GPU stage
// encodes before its tensors cross to the host: trainer/TrainerContext.h TimedLink).
torch::Tensor encodeInt8Boundary(const torch::Tensor& x);
// "" when `wire` (uint8, int8WireShape(shape)) is a valid encoding, else what is wrong (a negative
// or infinite scale, an int8 value −128). *nonfinite: some row's scale is NaN (the sender's row
// held NaN or Inf).
std::string checkInt8Boundary(const torch::Tensor& wire, bool* nonfinite);
// Wire form → float32 of `shape` (q · scale per row), computed on wire's device (a GPU stage
// decodes after the wire form crossed: node/pipeline/MailboxStageLink.h decodeOn); `wire` has
// passed checkInt8Boundary.
torch::Tensor decodeInt8Boundary(const torch::Tensor& wire, at::IntArrayRef shape);

}  // namespace cairn
