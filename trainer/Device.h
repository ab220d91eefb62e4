// Device: where one node trains (provider --device; issue [M], docs/TRAINING.md "Devices") and
// the two crossings its tensors make between that device and the host.
//   "auto" (the default)  the first CUDA device when this libtorch and the machine have one,
//                         else the CPU
//   "cpu", "cuda", "cuda:N"
// The stage module, its optimizer state, the loss and the master weights live on the device; what
// crosses the wire, the rings and the checkpoint files lives on the host (so a checkpoint written
// on a GPU resumes on a CPU machine and the other way round): TensorPlacement is that boundary.
// A CPU placement moves nothing (toDevice and toHost return their argument).
// Thread-safety: resolveDevice and the placements are safe to call from any thread.
#pragma once

#include <torch/script.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/TrainOptions.h"

namespace cairn {

// Whether this cairn was compiled against a libtorch with CUDA (CMake found
// TORCH_CUDA_LIBRARIES: PyTorch's CUDA libtorch; Debian's is CPU-only).
bool cudaBuild();

// The device `text` names; `context` names where it came from ("--device"). BadInput (exit 2)
// for a malformed name, for cuda on a build without CUDA ("this build of cairn has no CUDA …"),
// for a machine without a usable CUDA device, and for cuda:N past the device count.
torch::Device resolveDevice(const std::string& text, const std::string& context);

// A copy to the host that may still be under way (TensorPlacement::toHostLater).
struct HostCopy {
  torch::Tensor host;           // the values, once wait() has returned
  std::function<void()> until;  // waits for the copy to complete (empty: it is complete)
  void wait() const {
    if (until) until();
  }
};

class TensorPlacement {
 public:
  virtual ~TensorPlacement() = default;
  virtual torch::Device device() const = 0;
  // The tensor on the device (an undefined tensor stays undefined). From the host the copy goes
  // through pinned memory without blocking the host thread; CUDA orders it before the kernels
  // that use it.
  virtual torch::Tensor toDevice(const torch::Tensor& t) const = 0;
  // The tensor on the host with the same values (a host tensor as it is); waits for the copy.
  virtual torch::Tensor toHost(const torch::Tensor& t) const = 0;
  // toHost's copy, started and not waited for: on a GPU a non-blocking copy into pinned host
  // memory on the device's copy stream (trainer/CopyStream.h), behind the work that computes
  // `t`, and an event after it, so the host thread can queue more work (the next micro-batch's
  // forward) and the device run it while it finishes `t` and copies it (TimedLink::sendLater).
  // By default: toHost, complete at once.
  virtual HostCopy toHostLater(const torch::Tensor& t) const { return {toHost(t), {}}; }
  // Whether toHostLater's copies run behind the host thread (a GPU's do, on its copy stream,
  // which toDevice's copies take too): only then does TimedLink::sendLater hold a packet back.
  virtual bool copiesLater() const { return false; }
};

// The placement for `device` (CPU: the identity). CAIRN_TEST_SEND_LATER (a test and benchmark
// hook, trainer/Device.cpp): 1 makes every placement say its copies run later, 0 none; unset,
// a GPU's do and the CPU's do not.
std::shared_ptr<const TensorPlacement> makePlacement(torch::Device device);

// The values of one-element tensors, wherever each lives (all on one device), read to the host
// together as float64 — exact for float32 values and for integers below 2^53 — so that on a GPU
// the read waits for the device once, not once per value. Through `placement`'s toHost when given
// (a crossing the placement sees), else a plain copy to the host.
std::vector<double> readScalars(const std::vector<torch::Tensor>& values,
                                const TensorPlacement* placement = nullptr);

// Makes `device` the calling thread's current CUDA device, as torch.cuda.set_device does: what
// uses "the current device" (new streams and handles, allocations without an index) goes to it,
// not to GPU 0, so one provider per GPU on a machine with several does not also load GPU 0.
// Nothing for the CPU. StageTrainer::run calls it on the thread that trains.
void makeCurrentDevice(torch::Device device);

// Per-process math settings for training on `device` in `precision`: on CUDA, TF32 matmuls and
// convolutions on for fp32 and bf16; fp32-strict turns them off and asks for deterministic
// algorithms (CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set). Nothing on the CPU. Logs the device.
void configureDeviceMath(torch::Device device, Precision precision);

}  // namespace cairn
