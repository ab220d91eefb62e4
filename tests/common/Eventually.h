// eventually(condition): polls a condition another thread makes true, every 5 ms, until it holds or
// 10 s pass. What a test waits for this way is an event, not a time: the deadline only keeps a
// broken build from hanging, and no verdict depends on how fast the machine is.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace cairn::testing {

inline bool eventually(const std::function<bool()>& condition) {
  using namespace std::chrono_literals;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace cairn::testing
