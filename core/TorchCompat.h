// TorchCompat: the few libtorch API differences between Debian's libtorch 1.13 (the CI build) and
// PyTorch's own 2.x libtorch (the CUDA build GPU volunteers will use: issue [M]), in one place so
// the rooms compile against both from one source without #if of their own.
//   CAIRN_TORCH_AT_LEAST(M, m)   libtorch version M.m or later (torch/version.h)
//   IValueCopyMemo, deepcopyIValue(value, memo)
//                                IValue::deepcopy with a memo that keeps tied tensors tied: the
//                                memo is HashAliasedIValueMap in 1.x, HashIdentityIValueMap (and
//                                an optional device) from 2.1
//   CAIRN_ALLOCATOR_CONST, CAIRN_ALLOCATOR_COPY_DATA
//                                a c10::Allocator subclass: allocate() is const in 1.x and not
//                                from 2.3, where copy_data() became pure virtual (the default
//                                copy is kept)
//   autocastEnabled, setAutocastEnabled, autocastDtype, setAutocastDtype (device type: CPU, CUDA)
//                                autocast's per-device state: is_cpu_enabled / is_enabled (CUDA)
//                                and their dtype getters in 1.x, one function taking the device
//                                type from 2.4 (the old ones are deprecated there)
// Compiled here against 1.13 only (CI); the 2.x branches follow the 2.11 API that the GPU
// machine's build of 2026-11-26 reported for exactly these two uses (issue [M];
// ../shared/device/README.md builds there) and are not compiled until a session has that machine.
#pragma once

#include <torch/script.h>
#include <torch/version.h>
#include <ATen/autocast_mode.h>

#include <string>

#define CAIRN_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace cairn {

// "1.13.0": the libtorch this binary was compiled against (volunteers report it at join; the
// coordinator refuses one older than the libtorch that wrote the plan's stage files).
inline std::string libtorchVersion() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

#if CAIRN_TORCH_AT_LEAST(2, 1)
using IValueCopyMemo = c10::IValue::HashIdentityIValueMap;
#else
using IValueCopyMemo = c10::IValue::HashAliasedIValueMap;
#endif

inline c10::IValue deepcopyIValue(const c10::IValue& value, IValueCopyMemo& memo) {
  return value.deepcopy(memo);
}

#if CAIRN_TORCH_AT_LEAST(2, 4)
inline bool autocastEnabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
inline void setAutocastEnabled(c10::DeviceType type, bool on) {
  at::autocast::set_autocast_enabled(type, on);
}
inline at::ScalarType autocastDtype(c10::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
inline void setAutocastDtype(c10::DeviceType type, at::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
inline bool autocastEnabled(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
inline void setAutocastEnabled(c10::DeviceType type, bool on) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
inline at::ScalarType autocastDtype(c10::DeviceType type) {
  return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                       : at::autocast::get_autocast_cpu_dtype();
}
inline void setAutocastDtype(c10::DeviceType type, at::ScalarType dtype) {
  if (type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

}  // namespace cairn

#if CAIRN_TORCH_AT_LEAST(2, 3)
#define CAIRN_ALLOCATOR_CONST
#define CAIRN_ALLOCATOR_COPY_DATA                                                  \
  void copy_data(void* dest, const void* src, std::size_t count) const override { \
    default_copy_data(dest, src, count);                                           \
  }
#else
#define CAIRN_ALLOCATOR_CONST const
#define CAIRN_ALLOCATOR_COPY_DATA
#endif
