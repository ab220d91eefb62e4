#include "node/ring/RingTestHooks.h"

#include <atomic>
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
  static std::atomic<bool> fired{false};
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
  if (parts[0] != node || fired.load()) return;
  for (size_t i = 0; i < ring.tensors.size(); ++i) {
    if (ring.spec.parameters[i] != parts[1]) continue;
    const torch::Tensor& t = ring.tensors[i];
    if (t.scalar_type() != torch::kFloat || !t.is_contiguous() || !t.device().is_cpu() ||
        index < 0 || index >= t.numel() || bit < 0 || bit > 31)
      CAIRN_THROW(BadInput, "CAIRN_TEST_FLIP_AFTER_AVERAGE=", value, ": ", parts[1],
                  " has no float element ", index, " with a bit ", bit, " on the CPU");
    if (fired.exchange(true)) return;
    float* at = t.data_ptr<float>() + index;
    const float before = flipFloatBit(at, int(bit));
    CAIRN_WARN("test hook CAIRN_TEST_FLIP_AFTER_AVERAGE: flipped bit ", bit, " of ", parts[1], "[",
               index, "] after the average: ", before, " -> ", *at);
    return;
  }
}

}  // namespace cairn
