// CopyStream: a device's side stream for the copies between it and the host (issue [M]: "the copy
// of micro-batch k overlapping the compute of k + 1 (CUDA streams and events)"). A copy queued on
// the stream that computes (the calling thread's current stream) runs on the device only after
// everything queued before it and holds back everything queued after it: micro-batch k's copy to
// the host and k + 1's forward would take turns. On a side stream the copy waits only for what
// it reads (an event recorded on the compute stream) and runs while the compute stream goes on.
//
// Two things the device's caching allocator needs to hear, done here (the CUDA semantics of
// Tensor.record_stream): a tensor a copy reads on the side stream is recorded on it, so its
// memory is not handed to a later allocation of the compute stream before the copy has read it;
// a tensor a copy writes is allocated on the side stream and recorded on the compute stream
// that reads it next.
//
// Written against c10's device-generic guard interface (c10/core/impl/DeviceGuardImplInterface),
// so it compiles against a CPU-only libtorch too and its choreography is tested there with a test
// double of that interface (tests/trainer/CopyStreamTest.cpp); CudaPlacement (trainer/Device.cpp)
// gives it the registry's CUDA implementation. Events are the interface's own (void* handles)
// because c10::Event finds its implementation in the registry only.
// Thread-safety: both calls may come from several threads at once (the trainer's thread and
// autograd's, in node/ring/GradientOverlap); the current stream they read and set is per thread.
#pragma once

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/script.h>

#include <functional>

namespace cairn {

class CopyStream {
 public:
  // `guard` must outlive the CopyStream (the registry's implementations live for the process).
  // Takes one stream of `device`'s pool for its copies.
  CopyStream(const c10::impl::DeviceGuardImplInterface* guard, c10::Device device);

  // Runs `copy` (which reads `source`, memory on the device, and queues its copy on the calling
  // thread's current stream) with the side stream current, behind everything the calling
  // thread's current stream had queued (so behind the kernels that compute `source`). Returns a
  // wait for the copy's completion (safe to call from any thread, and to drop uncalled).
  std::function<void()> readLater(const c10::DataPtr& source,
                                  const std::function<void()>& copy) const;

  // Runs `copy` (which allocates a tensor on the device and queues what fills it) with the side
  // stream current; whatever the calling thread queues on its current stream afterwards waits
  // for it. Returns that tensor.
  torch::Tensor write(const std::function<torch::Tensor()>& copy) const;

  c10::Stream stream() const { return side_; }

 private:
  const c10::impl::DeviceGuardImplInterface* guard_;
  c10::Device device_;
  c10::Stream side_;
};

}  // namespace cairn
