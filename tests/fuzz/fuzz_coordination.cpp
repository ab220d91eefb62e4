// libFuzzer entry point: tools/fuzz.sh builds it with clang -fsanitize=fuzzer,address,undefined.
#include "tests/fuzz/FuzzTargets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cairn::fuzz::coordination(data, size);
  return 0;
}
