// CopyStream (trainer/CopyStream.h, issue [M]): the copies between a GPU and the host run on a
// side stream, ordered against the compute stream by events, with the caching allocator told
// which stream uses which memory. Checked on the CPU through a test double of c10's device guard
// interface — the interface CUDA implements (c10/cuda/impl/CUDAGuardImpl) — that models a
// device's streams: it logs every call with the stream it names, keeps the thread's current
// stream, and passes an event only after it has been asked about it a set number of times. The
// reference is CUDA's contract for work across streams (the semantics of Tensor.record_stream and
// of an event a stream waits for): a copy that reads on the side stream must come after a wait
// for an event recorded on the compute stream, the memory it reads must be recorded on the side
// stream, and its end must be an event on the side stream recorded after it; memory a copy writes
// must be allocated on the side stream, the compute stream must wait for an event recorded after
// the copy, and the memory must be recorded on the compute stream. Each test fails if any one of
// those steps is left out. The real crossings run on the GPU (tools/gpu/gpu_figures.sh: figure 1,
// equal to one PyTorch process within 1e-5, runs through them).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer/CopyStream.h"

namespace cairn {
namespace {

const c10::Device kGpu(c10::DeviceType::CUDA, 0);
constexpr c10::StreamId kComputeId = 0;
constexpr c10::StreamId kSideId = 5;

c10::Stream streamOf(c10::StreamId id) { return c10::Stream(c10::Stream::UNSAFE, kGpu, id); }

struct Call {
  std::string what;  // record, block, query, destroy, keep, copy, pool
  c10::StreamId stream = -1;
  int event = 0;            // the event's number (events are numbered from 1 as first recorded)
  const void* data = nullptr;  // keep: the memory recorded on `stream`
};

// A device as c10's guard interface sees it, for one thread.
class FakeGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  mutable std::vector<Call> calls;
  mutable c10::Stream current = streamOf(kComputeId);
  int queries_until_passed = 3;  // per event: queries answered "not yet" before "passed"

  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device d) const override { return d; }
  c10::Device getDevice() const override { return kGpu; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override { return current; }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override {
    calls.push_back({"pool", kSideId});
    return streamOf(kSideId);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const c10::Stream previous = current;
    current = s;
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*event == nullptr) *event = new int(++events_);
    calls.push_back({"record", stream.id(), number(*event)});
  }
  void block(void* event, const c10::Stream& stream) const override {
    calls.push_back({"block", stream.id(), number(event)});
  }
  bool queryEvent(void* event) const override {
    calls.push_back({"query", -1, number(event)});
    const auto asked = std::count_if(calls.begin(), calls.end(), [&](const Call& c) {
      return c.what == "query" && c.event == number(event);
    });
    return asked > queries_until_passed;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    calls.push_back({"destroy", -1, number(event)});
    delete static_cast<int*>(event);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data, const c10::Stream& stream) const override {
    calls.push_back({"keep", stream.id(), 0, data.get()});
  }

  // Index of the first call matching `pred` at or after `from`; calls.size() if none.
  template <typename Pred>
  size_t find(Pred pred, size_t from = 0) const {
    for (size_t i = from; i < calls.size(); ++i)
      if (pred(calls[i])) return i;
    return calls.size();
  }
  // The stream an event was last recorded on before call `before`.
  c10::StreamId recordedOn(int event, size_t before) const {
    c10::StreamId on = -1;
    for (size_t i = 0; i < before; ++i)
      if (calls[i].what == "record" && calls[i].event == event) on = calls[i].stream;
    return on;
  }

 private:
  static int number(void* event) { return event ? *static_cast<int*>(event) : 0; }
  mutable int events_ = 0;
};

TEST(CopyStream, TakesOneStreamOfThePoolAndRefusesAnUnindexedDevice) {
  FakeGuard guard;
  CopyStream copies(&guard, kGpu);
  EXPECT_EQ(copies.stream().id(), kSideId);
  EXPECT_EQ(std::count_if(guard.calls.begin(), guard.calls.end(),
                          [](const Call& c) { return c.what == "pool"; }),
            1);
  EXPECT_ANY_THROW(CopyStream(&guard, c10::Device(c10::DeviceType::CUDA)));
  EXPECT_ANY_THROW(CopyStream(&guard, c10::Device(c10::DeviceType::CPU)));
}

TEST(CopyStream, AReadRunsOnTheSideStreamBehindTheComputeStreamAndKeepsItsSource) {
  FakeGuard guard;
  const CopyStream copies(&guard, kGpu);
  guard.calls.clear();
  const torch::Tensor source = torch::arange(6, torch::kFloat);  // stands for device memory
  const c10::DataPtr& memory = source.storage().data_ptr();
  c10::StreamId copied_on = -1;
  const std::function<void()> wait = copies.readLater(memory, [&] {
    copied_on = guard.current.id();
    guard.calls.push_back({"copy", guard.current.id()});
  });
  EXPECT_EQ(copied_on, kSideId) << "the copy is queued on the side stream";
  EXPECT_EQ(guard.current.id(), kComputeId) << "the compute stream is current again";

  const size_t copy = guard.find([](const Call& c) { return c.what == "copy"; });
  ASSERT_LT(copy, guard.calls.size());
  // Before the copy the side stream waits for a point recorded on the compute stream.
  bool waited_for_compute = false;
  for (size_t i = 0; i < copy; ++i)
    if (guard.calls[i].what == "block" && guard.calls[i].stream == kSideId)
      waited_for_compute |= guard.recordedOn(guard.calls[i].event, i) == kComputeId;
  EXPECT_TRUE(waited_for_compute) << "the copy would read memory its kernels have not written";
  // The memory it reads is recorded on the side stream.
  EXPECT_LT(guard.find([&](const Call& c) {
              return c.what == "keep" && c.stream == kSideId && c.data == memory.get();
            }),
            guard.calls.size())
      << "the compute stream's allocator could reuse the source before the copy has read it";

  // The wait returns once an event recorded on the side stream after the copy has passed.
  ASSERT_TRUE(wait);
  const size_t before_wait = guard.calls.size();
  wait();
  const size_t last_query = [&] {
    size_t last = guard.calls.size();
    for (size_t i = before_wait; i < guard.calls.size(); ++i)
      if (guard.calls[i].what == "query") last = i;
    return last;
  }();
  ASSERT_LT(last_query, guard.calls.size()) << "the wait asked about no event";
  const int waited = guard.calls[last_query].event;
  EXPECT_EQ(guard.recordedOn(waited, copy), -1) << "the event was recorded before the copy";
  EXPECT_EQ(guard.recordedOn(waited, last_query), kSideId);
  EXPECT_EQ(std::count_if(guard.calls.begin() + before_wait, guard.calls.end(),
                          [&](const Call& c) { return c.what == "query" && c.event == waited; }),
            guard.queries_until_passed + 1)
      << "the wait returned before the event passed";
}

TEST(CopyStream, AWriteIsAllocatedOnTheSideStreamAndTheComputeStreamWaitsForIt) {
  FakeGuard guard;
  const CopyStream copies(&guard, kGpu);
  guard.calls.clear();
  c10::StreamId allocated_on = -1;
  const torch::Tensor written = copies.write([&] {
    allocated_on = guard.current.id();
    guard.calls.push_back({"copy", guard.current.id()});
    return torch::ones({2, 3});
  });
  EXPECT_EQ(allocated_on, kSideId) << "allocated and filled on the side stream";
  EXPECT_EQ(guard.current.id(), kComputeId);
  EXPECT_TRUE(torch::equal(written, torch::ones({2, 3})));

  const size_t copy = guard.find([](const Call& c) { return c.what == "copy"; });
  const size_t block = guard.find(
      [](const Call& c) { return c.what == "block" && c.stream == kComputeId; }, copy);
  ASSERT_LT(block, guard.calls.size()) << "the compute stream does not wait for the copy";
  const int event = guard.calls[block].event;
  EXPECT_EQ(guard.recordedOn(event, copy), -1) << "the event was recorded before the copy";
  EXPECT_EQ(guard.recordedOn(event, block), kSideId);
  EXPECT_LT(guard.find([&](const Call& c) {
              return c.what == "keep" && c.stream == kComputeId &&
                     c.data == written.storage().data_ptr().get();
            }),
            guard.calls.size())
      << "freed, the memory could go to the side stream's next copy while the compute stream "
         "still reads it";
}

TEST(CopyStream, ACopyThatThrowsLeavesTheComputeStreamCurrent) {
  FakeGuard guard;
  const CopyStream copies(&guard, kGpu);
  const torch::Tensor source = torch::zeros({1});
  EXPECT_THROW(copies.readLater(source.storage().data_ptr(),
                                [] { throw std::runtime_error("copy failed"); }),
               std::runtime_error);
  EXPECT_EQ(guard.current.id(), kComputeId);
  EXPECT_THROW(copies.write([]() -> torch::Tensor { throw std::runtime_error("copy failed"); }),
               std::runtime_error);
  EXPECT_EQ(guard.current.id(), kComputeId);
}

}  // namespace
}  // namespace cairn
