#include "node/ring/RingTestHooks.h"

#include <mutex>
#include <set>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/TestFlipBit.h"

namespace cairn {

void testFlipAfterAverage(const std::string& node, Ring& ring) {
  const char* value = std::getenv("CAIRN_TEST_FLIP_AFTER_AVERAGE");
  if (!value || !*value) return;
  // Once per process for each value (tests in one process set different ones).
  static std::mutex mutex;
  static std::set<std::string> fired;
  std::vector<std::string> parts;
  std::stringstream in(value);
  for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
  int64_t index = 0, bit = 0;
  try {
    if (parts.size() != 4) throw std::invalid_argument("parts");
    index = std::stoll(parts[2]), bit = std::stoll(parts[3]);
  } catch (const std::exception&) {
    CAIRN_THROW(BadInput, "CAIRN_TEST_FLIP_AFTER_AVERAGE=", value, ": expected NODE:TENSOR:INDEX:BIT");
  }
  if (parts[0] != node) return;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (fired.count(value)) return;
  }
  for (size_t i = 0; i < ring.tensors.size(); ++i) {
    if (ring.spec.parameters[i] != parts[1]) continue;
    const torch::Tensor& t = ring.tensors[i];
    if (t.scalar_type() != torch::kFloat || !t.is_contiguous() || !t.device().is_cpu() ||
        index < 0 || index >= t.numel() || bit < 0 || bit > 31)
      CAIRN_THROW(BadInput, "CAIRN_TEST_FLIP_AFTER_AVERAGE=", value, ": ", parts[1],
                  " has no float element ", index, " with a bit ", bit, " on the CPU");
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!fired.insert(value).second) return;
    }
    float* at = t.data_ptr<float>() + index;
    const float before = flipFloatBit(at, int(bit));
    // DiLoCo: the outer step's result is θ_prev (the weights are a copy of it): flip it there too.
    bool outer = false;
    for (RingBucket& b : ring.buckets) {
      int64_t offset = 0;
      for (size_t m : b.members) {
        if (m == i && b.previous.defined() && b.previous.scalar_type() == torch::kFloat) {
          flipFloatBit(b.previous.data_ptr<float>() + offset + index, int(bit));
          outer = true;
        }
        offset += ring.tensors[m].numel();
      }
    }
    CAIRN_WARN("test hook CAIRN_TEST_FLIP_AFTER_AVERAGE: flipped bit ", bit, " of ", parts[1], "[",
               index, "]", outer ? " and of its θ_prev" : "", " after the sync: ", before, " -> ", *at);
    return;
  }
}

}  // namespace cairn
