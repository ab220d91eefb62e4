#include "trainer/TestFlipBit.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

float flipFloatBit(float* at, int bit) {
  const float before = *at;
  uint32_t bits = 0;
  std::memcpy(&bits, at, sizeof bits);
  bits ^= uint32_t(1) << bit;
  std::memcpy(at, &bits, sizeof bits);
  return before;
}

void testFlipBit(torch::jit::Module& stage, int cluster, int stage_index, int64_t steps_done) {
  const char* value = std::getenv("CAIRN_TEST_FLIP_BIT");
  if (!value || !*value) return;
  std::vector<std::string> parts;
  std::stringstream in(value);
  for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
  int64_t c = 0, s = 0, step = 0, index = 0, bit = 0;
  try {
    if (parts.size() != 7) throw std::invalid_argument("parts");
    c = std::stoll(parts[0]), s = std::stoll(parts[1]), step = std::stoll(parts[2]);
    index = std::stoll(parts[4]), bit = std::stoll(parts[5]);
  } catch (const std::exception&) {
    CAIRN_THROW(BadInput, "CAIRN_TEST_FLIP_BIT=", value,
                ": expected CLUSTER:STAGE:STEP:TENSOR:INDEX:BIT:FILE");
  }
  if (c != cluster || s != stage_index || step != steps_done) return;
  const std::string& once = parts[6];
  if (std::ifstream(once).good()) return;
  for (const auto& p : stage.named_parameters(true)) {
    if (p.name != parts[3]) continue;
    if (p.value.scalar_type() != torch::kFloat || !p.value.is_contiguous() ||
        !p.value.device().is_cpu() || index < 0 ||
        index >= p.value.numel() || bit < 0 || bit > 31)
      CAIRN_THROW(BadInput, "CAIRN_TEST_FLIP_BIT=", value, ": ", parts[3],
                  " has no float element ", index, " with a bit ", bit, " on the CPU");
    torch::NoGradGuard no_grad;
    float* at = p.value.data_ptr<float>() + index;
    const float before = flipFloatBit(at, int(bit));
    std::ofstream(once) << steps_done << "\n";
    CAIRN_WARN("test hook CAIRN_TEST_FLIP_BIT: flipped bit ", bit, " of ", parts[3], "[", index,
               "] after step ", steps_done, ": ", before, " -> ", *at);
    return;
  }
  CAIRN_THROW(BadInput, "CAIRN_TEST_FLIP_BIT=", value, ": this stage has no parameter ", parts[3]);
}

}  // namespace cairn
