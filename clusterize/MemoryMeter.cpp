#include "clusterize/MemoryMeter.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include "core/Error.h"
#include "core/TorchCompat.h"

namespace cairn::clusterize {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

// Sizes of live counted allocations; data pointer == context, so raw_allocate works too.
std::mutex g_mutex;
std::unordered_map<void*, int64_t>& sizes() {
  static auto* map = new std::unordered_map<void*, int64_t>();
  return *map;
}

void releaseCounted(void* data) {
  if (data == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = sizes().find(data);
    if (it != sizes().end()) {
      g_live -= it->second;
      sizes().erase(it);
    }
  }
  c10::free_cpu(data);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) CAIRN_ALLOCATOR_CONST override {
    void* data = c10::alloc_cpu(bytes);
    if (data != nullptr) {
      std::lock_guard<std::mutex> lock(g_mutex);
      sizes()[data] = static_cast<int64_t>(bytes);
    }
    const int64_t live = (g_live += static_cast<int64_t>(bytes));
    int64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
    return {data, data, &releaseCounted, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &releaseCounted; }
  CAIRN_ALLOCATOR_COPY_DATA
};

c10::Allocator* g_previous = nullptr;

}  // namespace

MemoryMeter::MemoryMeter() {
  bool expected = false;
  if (!g_installed.compare_exchange_strong(expected, true))
    CAIRN_THROW(InternalError, "only one MemoryMeter may be installed at a time");
  g_previous = c10::GetCPUAllocator();
  static auto* counting = new CountingAllocator();  // lives forever: counted tensors outlive us
  c10::SetCPUAllocator(counting, /*priority=*/100);
  g_peak = g_live.load();
}

MemoryMeter::~MemoryMeter() {
  c10::SetCPUAllocator(g_previous, /*priority=*/100);
  g_installed = false;
}

int64_t MemoryMeter::liveBytes() const { return g_live.load(); }
int64_t MemoryMeter::peakBytes() const { return g_peak.load(); }
void MemoryMeter::resetPeak() { g_peak = g_live.load(); }

}  // namespace cairn::clusterize
