#include "trainer/Device.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <regex>

#include "core/Error.h"
#include "core/Log.h"
#include "core/TorchCompat.h"
#include "trainer/CopyStream.h"

namespace cairn {

namespace {

std::string noCudaReason() {
  if (!cudaBuild())
    return "this build of cairn links libtorch " + libtorchVersion() +
           " without CUDA (Debian's libtorch is CPU-only; README \"GPU volunteers\" says how to "
           "build against PyTorch's CUDA libtorch)";
  return "libtorch " + libtorchVersion() +
         " has CUDA but sees no usable CUDA device on this machine (driver, "
         "CUDA_VISIBLE_DEVICES?)";
}

// CAIRN_TEST_SEND_LATER, a test and benchmark hook (unset: each device's own way, a GPU's copies
// run behind the host thread and the CPU's do not). 1: every placement says its copies run later
// (the CPU's are complete at once), so a CPU provider holds back what it sends as a GPU provider
// does (TimedLink::sendLater) — how tests/integration/two_clusters_test.py runs that path through
// real processes and rings without a GPU. 0: none does, so a GPU provider sends at once and
// copies on its compute stream, as before sending later and the copy stream existed — what
// tools/gpu/overhead.py --at-once compares against. The
// rings follow the same answer: with 1 the overlapped gradient all-reduce copies each bucket out
// in the backward that finishes it (node/ring/GradientOverlap.h), as on a GPU. Any other value is
// a BadInput naming the variable.
std::optional<bool> sendLaterOverride() {
  const char* value = std::getenv("CAIRN_TEST_SEND_LATER");
  const std::string v = value ? value : "";
  if (v.empty()) return std::nullopt;
  if (v != "1" && v != "0")
    CAIRN_THROW(BadInput, "CAIRN_TEST_SEND_LATER=", inQuotes(v), ": expected 1 or 0 (or unset)");
  static std::once_flag said;
  std::call_once(said, [&] {
    CAIRN_WARN("CAIRN_TEST_SEND_LATER=", v, " (a test hook): what this node sends ",
               v == "1" ? "is held back until its next pass is queued, as on a GPU"
                        : "leaves at once, on a GPU too");
  });
  return v == "1";
}

class CpuPlacement final : public TensorPlacement {
 public:
  explicit CpuPlacement(bool copies_later) : copies_later_(copies_later) {}
  torch::Device device() const override { return torch::kCPU; }
  torch::Tensor toDevice(const torch::Tensor& t) const override { return t; }
  torch::Tensor toHost(const torch::Tensor& t) const override { return t; }
  bool copiesLater() const override { return copies_later_; }

 private:
  bool copies_later_;
};

class CudaPlacement final : public TensorPlacement {
 public:
  // With copies that run later (the default on a GPU), the copies between the device and the
  // host run on a side stream of their own (trainer/CopyStream.h), so micro-batch k's copy runs
  // on the device while the compute stream runs k + 1. Without (CAIRN_TEST_SEND_LATER=0), every
  // copy is queued on the compute stream, as before the side stream existed: what
  // tools/gpu/overhead.py --at-once compares against.
  CudaPlacement(torch::Device device, bool copies_later) : device_(device) {
    if (copies_later) side_.emplace(c10::impl::getDeviceGuardImpl(device.type()), device);
  }
  torch::Device device() const override { return device_; }
  torch::Tensor toDevice(const torch::Tensor& t) const override {
    if (!t.defined() || t.device() == device_) return t;
    if (!t.device().is_cpu()) return t.to(device_);
    // Pinned host memory lets the copy run asynchronously to the host thread; the compute stream
    // waits for it (on the side stream) or queues it (without one) before any kernel that reads
    // the result.
    const torch::Tensor pinned = t.is_pinned() ? t : t.contiguous().pin_memory();
    if (!side_) return pinned.to(device_, /*non_blocking=*/true);
    return side_->write([&] { return pinned.to(device_, /*non_blocking=*/true); });
  }
  torch::Tensor toHost(const torch::Tensor& t) const override {
    if (!t.defined() || t.device().is_cpu()) return t;
    return t.to(torch::kCPU);  // synchronous: the wire reads the bytes right after
  }
  HostCopy toHostLater(const torch::Tensor& t) const override {
    if (!side_ || !t.defined() || t.device().is_cpu()) return {toHost(t), {}};
    torch::Tensor host =
        torch::empty(t.sizes(), torch::TensorOptions().dtype(t.scalar_type()).pinned_memory(true));
    // From the device to pinned memory: asynchronous to the host, on the side stream behind the
    // kernels that compute `t`.
    std::function<void()> until =
        side_->readLater(t.storage().data_ptr(), [&] { host.copy_(t, /*non_blocking=*/true); });
    return {host, std::move(until)};
  }
  bool copiesLater() const override { return side_.has_value(); }

 private:
  torch::Device device_;
  std::optional<CopyStream> side_;  // set when copies run later
};

}  // namespace

bool cudaBuild() {
#ifdef CAIRN_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

torch::Device resolveDevice(const std::string& text, const std::string& context) {
  static const std::regex kForm("auto|cpu|cuda(:(0|[1-9][0-9]{0,3}))?");
  if (!std::regex_match(text, kForm))
    CAIRN_THROW(BadInput, context, " ", inQuotes(text),
                " is not a device: expected auto, cpu, cuda or cuda:N");
  if (text == "cpu") return torch::kCPU;
  const bool available = torch::cuda::is_available();
  if (text == "auto") return available ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (!available) CAIRN_THROW(BadInput, context, " ", text, ": ", noCudaReason());
  const int64_t index = text == "cuda" ? 0 : std::stoll(text.substr(5));
  const int64_t count = int64_t(torch::cuda::device_count());
  if (index >= count)
    CAIRN_THROW(BadInput, context, " ", text, ": this machine has ", count,
                " CUDA device(s), numbered from 0");
  return torch::Device(torch::kCUDA, c10::DeviceIndex(index));
}

std::shared_ptr<const TensorPlacement> makePlacement(torch::Device device) {
  const std::optional<bool> later = sendLaterOverride();
  if (device.is_cpu()) return std::make_shared<CpuPlacement>(later.value_or(false));
  CAIRN_ENFORCE(device.is_cuda(), "no placement for device ", device.str());
  return std::make_shared<CudaPlacement>(device, later.value_or(true));
}

std::vector<double> readScalars(const std::vector<torch::Tensor>& values,
                                const TensorPlacement* placement) {
  if (values.empty()) return {};
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& v : values) flat.push_back(v.detach().reshape({1}).to(torch::kDouble));
  const torch::Tensor joined = torch::cat(flat);
  const torch::Tensor host =
      (placement ? placement->toHost(joined) : joined.to(torch::kCPU)).contiguous();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

void makeCurrentDevice(torch::Device device) {
  if (!device.is_cuda() || !device.has_index()) return;  // resolveDevice always gives one
  // The device-generic guard interface (c10/core/impl): the same call against Debian's CPU-only
  // libtorch, which never gets here (resolveDevice refuses cuda there).
  c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
}

void configureDeviceMath(torch::Device device, Precision precision) {
  if (!device.is_cuda()) return;
  const bool strict = precision == Precision::kFp32Strict;
  at::globalContext().setAllowTF32CuBLAS(!strict);
  at::globalContext().setAllowTF32CuDNN(!strict);
  if (strict) {
    // Reproducible fp32: deterministic kernels (an op without one throws, naming itself), which
    // cuBLAS gives only with a fixed workspace; set before its first handle, unless the user did.
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  CAIRN_INFO("training on ", device.str(),
             strict ? " (fp32-strict: no TF32, deterministic algorithms)" : " (TF32 matmuls on)");
}

}  // namespace cairn
