#include "trainer/CopyStream.h"

#include <memory>
#include <thread>

#include "core/Error.h"

namespace cairn {

namespace {

using c10::impl::DeviceGuardImplInterface;

// One event of the guard interface: a handle its first record creates, destroyed with this
// object (CUDA allows that before the work it marks has run: the event is released then).
class GuardEvent {
 public:
  GuardEvent(const DeviceGuardImplInterface* guard, c10::DeviceIndex index)
      : guard_(guard), index_(index) {}
  ~GuardEvent() {
    if (event_) guard_->destroyEvent(event_, index_);
  }
  GuardEvent(const GuardEvent&) = delete;
  GuardEvent& operator=(const GuardEvent&) = delete;

  // Marks the point `stream` has reached in what is queued on it.
  void record(const c10::Stream& stream) {
    guard_->record(&event_, stream, index_, c10::EventFlag::PYTORCH_DEFAULT);
  }
  // What is queued on `stream` from now on waits until that point is passed.
  void block(const c10::Stream& stream) const { guard_->block(event_, stream); }
  bool passed() const { return guard_->queryEvent(event_); }

 private:
  const DeviceGuardImplInterface* guard_;
  c10::DeviceIndex index_;
  void* event_ = nullptr;
};

// `stream` is the calling thread's current stream of its device while this lives.
class StreamCurrent {
 public:
  StreamCurrent(const DeviceGuardImplInterface* guard, const c10::Stream& stream)
      : guard_(guard), previous_(guard->exchangeStream(stream)) {}
  ~StreamCurrent() { guard_->exchangeStream(previous_); }
  StreamCurrent(const StreamCurrent&) = delete;
  StreamCurrent& operator=(const StreamCurrent&) = delete;

 private:
  const DeviceGuardImplInterface* guard_;
  c10::Stream previous_;
};

c10::Stream sideStream(const DeviceGuardImplInterface* guard, c10::Device device) {
  CAIRN_ENFORCE(guard != nullptr && guard->type() == device.type() && device.has_index(),
                "a copy stream needs its device's guard implementation and an indexed device, "
                "got ", device.str());
  return guard->getStreamFromGlobalPool(device);
}

}  // namespace

CopyStream::CopyStream(const DeviceGuardImplInterface* guard, c10::Device device)
    : guard_(guard), device_(device), side_(sideStream(guard, device)) {}

std::function<void()> CopyStream::readLater(const c10::DataPtr& source,
                                            const std::function<void()>& copy) const {
  const c10::Stream compute = guard_->getStream(device_);
  {
    GuardEvent computed(guard_, device_.index());
    computed.record(compute);
    computed.block(side_);
  }
  {
    StreamCurrent on_side(guard_, side_);
    copy();
  }
  // The compute stream may free `source` the moment its last reference goes; its allocator
  // hands the memory out again only after the side stream has passed this point.
  guard_->recordDataPtrOnStream(source, side_);
  auto copied = std::make_shared<GuardEvent>(guard_, device_.index());
  copied->record(side_);
  // Polled: the interface has no blocking wait before PyTorch 2 (c10::Event::synchronize).
  return [copied] {
    while (!copied->passed()) std::this_thread::yield();
  };
}

torch::Tensor CopyStream::write(const std::function<torch::Tensor()>& copy) const {
  const c10::Stream compute = guard_->getStream(device_);
  torch::Tensor out;
  {
    StreamCurrent on_side(guard_, side_);
    out = copy();  // allocated on the side stream, so no compute-stream work can still use it
  }
  GuardEvent copied(guard_, device_.index());
  copied.record(side_);
  copied.block(compute);
  // Freed after the compute stream has read it, its memory returns to the side stream's pool
  // only once the compute stream has passed this point.
  if (out.defined() && out.has_storage())
    guard_->recordDataPtrOnStream(out.storage().data_ptr(), compute);
  return out;
}

}  // namespace cairn
