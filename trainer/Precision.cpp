#include "trainer/Precision.h"

#include <ATen/autocast_mode.h>

#include <fstream>
#include <string>

#include "core/Log.h"
#include "core/TorchCompat.h"

namespace cairn {

AutocastScope::AutocastScope(Precision precision, c10::DeviceType device)
    : active_(precision == Precision::kBf16), device_(device) {
  if (!active_) return;
  previous_enabled_ = autocastEnabled(device_);
  previous_dtype_ = autocastDtype(device_);
  setAutocastEnabled(device_, true);
  setAutocastDtype(device_, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  setAutocastEnabled(device_, previous_enabled_);
  setAutocastDtype(device_, previous_dtype_);
}

torch::Tensor toFloat32IfReduced(const torch::Tensor& t) {
  if (t.defined() && (t.scalar_type() == torch::kBFloat16 || t.scalar_type() == torch::kHalf))
    return t.to(torch::kFloat);
  return t;
}

bool cpuHasNativeBf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    const std::string flags = line + " ";
    return flags.find(" avx512_bf16 ") != std::string::npos ||
           flags.find(" amx_bf16 ") != std::string::npos;
  }
  return false;
}

void announcePrecision(Precision precision, c10::DeviceType device) {
  if (precision != Precision::kBf16) return;
  if (device == c10::DeviceType::CUDA) {
    CAIRN_INFO("precision bf16: stage forwards under CUDA autocast to bfloat16; float32 master "
               "weights, gradients and optimizer state");
    return;
  }
  if (cpuHasNativeBf16()) {
    CAIRN_INFO("precision bf16: stage forwards under CPU autocast to bfloat16 (this CPU has native "
               "bf16); float32 master weights, gradients and optimizer state");
  } else {
    CAIRN_WARN("precision bf16: this CPU has neither avx512_bf16 nor amx_bf16, so bfloat16 is "
               "emulated and likely slower than fp32; float32 master weights are kept either way");
  }
}

}  // namespace cairn
