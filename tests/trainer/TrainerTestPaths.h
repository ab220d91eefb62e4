// Where the trainer tests find what ctest's fixtures made for them (tests/CMakeLists.txt:
// trainer.make_test_models, trainer.make_fashion_slice, trainer.make_recut_models), and how long
// the Fashion-MNIST slice cases train.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace cairn::testing {

// $CAIRN_TEST_MODELS, "" when it is unset (a test then fails saying so, or reads a path that
// does not exist and fails naming it).
inline std::string trainerModelsDir() {
  const char* dir = std::getenv("CAIRN_TEST_MODELS");
  return dir ? dir : "";
}

// The Fashion-MNIST slice cut into 3 stages by hand: CAIRN_FASHION_NODE_DATA when set, else
// $CAIRN_TEST_MODELS/fashion_slice; "" when neither is set.
inline std::string fashionSliceDir() {
  if (const char* dir = std::getenv("CAIRN_FASHION_NODE_DATA")) return dir;
  return trainerModelsDir().empty() ? "" : trainerModelsDir() + "/fashion_slice";
}

// How many steps the Fashion-MNIST slice cases train: CAIRN_FASHION_STEPS when set (0 trains the
// whole epoch), else `fallback` (AsyncSchedule.FashionMnistSliceSyncVsAsync: 60, 7,680 images, half
// the slice's epoch; Precision.FashionMnistSliceBf16VsFp32: 30, bf16 being emulated on AVX2 CPUs).
inline int64_t fashionSliceSteps(int64_t fallback) {
  const char* steps = std::getenv("CAIRN_FASHION_STEPS");
  return steps ? std::atoll(steps) : fallback;
}

}  // namespace cairn::testing
