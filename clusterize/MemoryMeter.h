// MemoryMeter: measures CPU tensor memory by installing a counting wrapper around libtorch's CPU
// allocator for its lifetime. liveBytes() is the memory of tensors allocated while a meter was
// installed and not yet freed; peakBytes() the highest value since construction or resetPeak().
// Tensors allocated before (e.g. a model loaded earlier) are not counted.
//
// Process-wide: at most one meter at a time (a second one throws InternalError); use it from one
// thread while no other thread allocates tensors you do not want counted. Counters are atomics.
#pragma once

#include <cstdint>

namespace cairn::clusterize {

class MemoryMeter {
 public:
  MemoryMeter();
  ~MemoryMeter();
  MemoryMeter(const MemoryMeter&) = delete;
  MemoryMeter& operator=(const MemoryMeter&) = delete;

  int64_t liveBytes() const;
  int64_t peakBytes() const;
  void resetPeak();  // peak := live
};

}  // namespace cairn::clusterize
