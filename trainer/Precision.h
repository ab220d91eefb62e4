// Mixed precision (job.json "precision": "bf16"). A stage's forward runs under libtorch's autocast
// to bfloat16 on the device it trains on (CPU autocast, or CUDA autocast on a GPU): matrix products and convolutions compute in bf16 (oneDNN's AVX512-BF16
// / AMX kernels where the CPU has them), the ops autocast keeps in float32 stay there, and the
// parameters, their gradients and the optimizer state stay float32 (master weights). What leaves
// a stage is float32 again: the wire, node.json's boundary dtypes and the loss see what they see
// in an fp32 run, and backward runs through the casts.
// Thread-safety: autocast's state is thread-local; an AutocastScope belongs to its thread.
#pragma once

#include <torch/script.h>

#include "trainer/TrainOptions.h"

namespace cairn {

// Autocast to bfloat16 on `device` (CPU or CUDA) for the scope's lifetime when `precision` is
// bf16 (nothing for fp32 and fp32-strict). On
// leaving the outermost scope autocast's cache of cast weights is cleared, as torch.autocast does,
// so an optimizer step is never hidden behind a stale bf16 copy.
class AutocastScope {
 public:
  explicit AutocastScope(Precision precision, c10::DeviceType device = c10::DeviceType::CPU);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_;
  c10::DeviceType device_;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

// A reduced-precision floating tensor (bf16, fp16) as float32; anything else as it is.
torch::Tensor toFloat32IfReduced(const torch::Tensor& t);

// Whether this CPU has native bf16 arithmetic (avx512_bf16 or amx_bf16 in /proc/cpuinfo).
bool cpuHasNativeBf16();
// Logs the precision a node trains in; warns when bf16 would be emulated (slower than fp32).
void announcePrecision(Precision precision, c10::DeviceType device = c10::DeviceType::CPU);

}  // namespace cairn
