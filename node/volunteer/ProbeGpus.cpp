// probeGpus() (Probe.h): each CUDA device's name, memory and measured throughput.
//
// This build has no CUDA headers: Debian's libtorch, the CI build, is CPU-only, and GPU volunteers
// build the same source against PyTorch's CUDA libtorch. So the device's name and total memory
// come from the CUDA driver API loaded at run time (dlopen("libcuda.so.1") + dlsym), with the few
// signatures declared below as the driver's cuda.h has them, and the measurements go through
// libtorch's own device dispatch (torch::mm, Tensor::copy_ on a kCUDA device), which a CPU-only
// libtorch compiles too and never reaches: with no device, nothing here runs past device_count().
#include <dlfcn.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "core/TorchCompat.h"
#include "node/volunteer/Probe.h"

namespace cairn {
namespace {
// A named namespace inside the anonymous one: the unity build batches this file with others.
namespace probe_gpus {

// cuda.h: typedef int CUresult (CUDA_SUCCESS = 0); typedef int CUdevice.
using CUresult = int;
using CUdevice = int;
constexpr CUresult kCudaSuccess = 0;

// The four driver entry points the probe needs, from libcuda.so.1 (loaded by libtorch's CUDA
// build already, so dlopen only takes another reference). cuDeviceTotalMem is the _v2 symbol (the
// size_t one; the unversioned symbol is the old 32-bit unsigned int ABI).
class CudaDriver {
 public:
  CudaDriver() : handle_(::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), &::dlclose) {
    if (!handle_) {
      const char* error = ::dlerror();
      CAIRN_THROW(InternalError, "the CUDA driver libcuda.so.1 could not be loaded (",
                  error ? error : "no reason given", ")");
    }
    init_ = symbol<CUresult (*)(unsigned int)>("cuInit");
    device_get_ = symbol<CUresult (*)(CUdevice*, int)>("cuDeviceGet");
    get_name_ = symbol<CUresult (*)(char*, int, CUdevice)>("cuDeviceGetName");
    total_mem_ = symbol<CUresult (*)(size_t*, CUdevice)>("cuDeviceTotalMem_v2");
    check(init_(0), "cuInit");
  }

  // The device's marketing name ("NVIDIA H100 80GB HBM3") and total memory in bytes.
  std::string name(int ordinal) const {
    char buffer[kMaxGpuNameBytes] = {};
    check(get_name_(buffer, int(sizeof buffer) - 1, device(ordinal)), "cuDeviceGetName");
    return std::string(buffer);
  }
  double totalBytes(int ordinal) const {
    size_t bytes = 0;
    check(total_mem_(&bytes, device(ordinal)), "cuDeviceTotalMem_v2");
    return double(bytes);
  }

 private:
  template <typename F>
  F symbol(const char* name) {
    void* address = ::dlsym(handle_.get(), name);
    if (!address) CAIRN_THROW(InternalError, "the CUDA driver libcuda.so.1 has no ", name);
    return reinterpret_cast<F>(address);
  }
  static void check(CUresult result, const char* call) {
    if (result != kCudaSuccess)
      CAIRN_THROW(InternalError, "the CUDA driver's ", call, " failed (CUresult ", result, ")");
  }
  CUdevice device(int ordinal) const {
    CUdevice d = 0;
    check(device_get_(&d, ordinal), "cuDeviceGet");
    return d;
  }

  std::unique_ptr<void, int (*)(void*)> handle_;
  CUresult (*init_)(unsigned int) = nullptr;
  CUresult (*device_get_)(CUdevice*, int) = nullptr;
  CUresult (*get_name_)(char*, int, CUdevice) = nullptr;
  CUresult (*total_mem_)(size_t*, CUdevice) = nullptr;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Seconds `work` takes on device `index`, from launch to torch::cuda::synchronize.
template <typename Work>
double timed(int index, Work work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  torch::cuda::synchronize(index);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Dense n×n matmuls in `dtype` on cuda:index: TFLOP/s, the median of 5 rounds of 10 after 3
// warm-up matmuls (kernel selection, clocks).
double matmulTflops(int index, torch::ScalarType dtype) {
  constexpr int64_t n = 4096;
  constexpr int kPerRound = 10;
  const auto options = torch::TensorOptions().device(torch::kCUDA, index).dtype(dtype);
  const torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  torch::Tensor c = torch::mm(a, b);
  (void)timed(index, [&] {
    for (int i = 0; i < 3; ++i) torch::mm_out(c, a, b);
  });
  std::vector<double> rates;
  for (int round = 0; round < 5; ++round) {
    const double s = timed(index, [&] {
      for (int i = 0; i < kPerRound; ++i) torch::mm_out(c, a, b);
    });
    rates.push_back(2.0 * n * n * n * kPerRound / s / 1e12);
  }
  return median(rates);
}

// Pinned host <-> cuda:index copies of 256 MiB: {h2d, d2h} GB/s, each the median of 5 after one
// warm-up copy each way.
std::pair<double, double> copyGbPerS(int index) {
  constexpr int64_t kBytes = int64_t(256) << 20;
  const torch::Tensor host = torch::empty({kBytes}, torch::kUInt8).pin_memory();
  const torch::Tensor device =
      torch::empty({kBytes}, torch::TensorOptions().device(torch::kCUDA, index).dtype(torch::kUInt8));
  (void)timed(index, [&] {
    device.copy_(host, /*non_blocking=*/true);
    host.copy_(device, /*non_blocking=*/true);
  });
  std::vector<double> h2d, d2h;
  for (int round = 0; round < 5; ++round) {
    h2d.push_back(kBytes / timed(index, [&] { device.copy_(host, /*non_blocking=*/true); }) / 1e9);
    d2h.push_back(kBytes / timed(index, [&] { host.copy_(device, /*non_blocking=*/true); }) / 1e9);
  }
  return {median(h2d), median(d2h)};
}

}  // namespace probe_gpus
}  // namespace

std::vector<GpuFigures> probeGpus(std::string* none_reason) {
  using namespace probe_gpus;
  auto none = [&](const std::string& why) {
    if (none_reason) *none_reason = why;
    return std::vector<GpuFigures>{};
  };
  const size_t count = torch::cuda::device_count();
  if (count == 0)
    return none("libtorch " + libtorchVersion() +
                " sees no CUDA device: a CPU-only libtorch, such as Debian's, or no NVIDIA GPU or "
                "driver");
  std::vector<GpuFigures> gpus;
  try {
    const CudaDriver driver;
    c10::InferenceMode inference;
    for (size_t i = 0; i < count; ++i) {
      const int index = int(i);
      GpuFigures g;
      g.name = driver.name(index);
      g.memory_gb = driver.totalBytes(index) / 1e9;
      g.fp32_tflops = matmulTflops(index, torch::kFloat32);
      g.bf16_tflops = matmulTflops(index, torch::kBFloat16);
      std::tie(g.h2d_gb_per_s, g.d2h_gb_per_s) = copyGbPerS(index);
      gpus.push_back(std::move(g));
    }
  } catch (const std::exception& e) {
    CAIRN_WARN("probe: GPUs left out: ", e.what());
    return none(std::string("measuring the ") + std::to_string(count) + " CUDA device(s) failed: " +
                e.what());
  }
  return gpus;
}

}  // namespace cairn
