#include "trainer/Int8Boundary.h"

#include <limits>

#include "core/Error.h"
#include "core/WireCompression.h"

namespace cairn {
namespace {

// Values per row: the product of the dimensions from index 1 (dim 2) or 2 (dim ≥ 3).
int64_t rowLength(at::IntArrayRef shape) { return wire::int8RowLength(shape.vec()); }

}  // namespace

bool int8Carries(int64_t dim) { return dim >= 2; }

std::vector<int64_t> int8WireShape(at::IntArrayRef shape) {
  CAIRN_ENFORCE(int8Carries(int64_t(shape.size())), "int8 wire form of a ", shape.size(),
                "-dimensional tensor");
  std::vector<int64_t> wire(shape.begin(), shape.begin() + (shape.size() == 2 ? 1 : 2));
  wire.push_back(rowLength(shape) + 4);
  return wire;
}

torch::Tensor encodeInt8Boundary(const torch::Tensor& x) {
  CAIRN_ENFORCE(x.scalar_type() == torch::kFloat, "int8 encode of a non-float32 tensor");
  const std::vector<int64_t> wire_shape = int8WireShape(x.sizes());
  const int64_t cols = wire_shape.back() - 4;
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  torch::Tensor out = torch::empty({rows, cols + 4}, x.options().dtype(torch::kByte));
  if (rows == 0 || cols == 0) return out.reshape(wire_shape);
  const torch::Tensor x2 = x.detach().contiguous().reshape({rows, cols});
  // Scales by the scalar formula of encodeInt8Rows (max|x| / 127.0f in float), so both round
  // alike; amax propagates NaN, and a row with NaN or Inf gets a NaN scale. Divided by a tensor,
  // not a scalar: CUDA divides by a host scalar as a product with its reciprocal, which can miss
  // the quotient by one bit, and a GPU stage encodes where its tensors are (trainer/TrainerContext.h).
  const torch::Tensor amax = x2.abs().amax(1, /*keepdim=*/true);
  const torch::Tensor scale =
      torch::where(torch::isfinite(amax), amax / torch::full_like(amax, 127.0f),
                   torch::full_like(amax, std::numeric_limits<float>::quiet_NaN()))
          .contiguous();
  const torch::Tensor usable = scale > 0;  // false for 0 and NaN
  const torch::Tensor q =
      torch::where(usable, torch::round(x2 / torch::where(usable, scale, torch::ones_like(scale))),
                   torch::zeros_like(x2))
          .clamp_(-127, 127)
          .to(torch::kChar);
  out.narrow(1, 0, 4).copy_(scale.view(torch::kByte));
  out.narrow(1, 4, cols).copy_(q.view(torch::kByte));
  return out.reshape(wire_shape);
}

std::string checkInt8Boundary(const torch::Tensor& wire, bool* nonfinite) {
  *nonfinite = false;
  if (wire.scalar_type() != torch::kByte || wire.dim() < 2 || wire.size(-1) < 4)
    return "not an int8 wire tensor";
  if (wire.numel() == 0) return "";
  const int64_t width = wire.size(-1);
  const torch::Tensor w = wire.reshape({-1, width});
  const torch::Tensor scale = w.narrow(1, 0, 4).contiguous().view(torch::kFloat);
  const torch::Tensor nan = torch::isnan(scale);
  *nonfinite = nan.any().item<bool>();
  const torch::Tensor bad = torch::logical_not(nan) & (torch::isinf(scale) | (scale < 0));
  if (bad.any().item<bool>())
    return "row " + std::to_string(bad.reshape({-1}).nonzero()[0].item<int64_t>()) +
           " has a negative or infinite scale";
  if (width > 4 && w.narrow(1, 4, width - 4).eq(128).any().item<bool>())  // int8 −128
    return "an int8 value is -128";
  return "";
}

torch::Tensor decodeInt8Boundary(const torch::Tensor& wire, at::IntArrayRef shape) {
  const int64_t width = wire.size(-1);
  const torch::Tensor w = wire.reshape({-1, width});
  if (w.numel() == 0) return torch::zeros(shape, wire.options().dtype(torch::kFloat));
  const torch::Tensor scale = w.narrow(1, 0, 4).contiguous().view(torch::kFloat);
  const torch::Tensor q = w.narrow(1, 4, width - 4).contiguous().view(torch::kChar);
  return (q.to(torch::kFloat) * scale).reshape(shape);
}

}  // namespace cairn
