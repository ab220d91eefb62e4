// Where the trainer tests find what ctest's fixtures made for them (tests/CMakeLists.txt:
// trainer.make_test_models, trainer.make_fashion_slice, trainer.make_recut_models).
#pragma once

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

}  // namespace cairn::testing
