#pragma once
// CAIRN_COUNT_OPS=PATH, a diagnostic (tools/gpu/op_count.py): every ATen operator this process
// dispatches, on every thread, is counted by name through a global RecordFunction callback, and the
// counts are written to PATH as JSON ({"total": N, "ops": {"aten::addmm": n, ...}}) when the
// OpCount ends. On a GPU each leaf operator is a kernel launch, so the operators of a step say
// what a launch-bound step costs; counted on the CPU, they compare a provider's step with PyTorch's
// own loop without a GPU. Unset: nothing is registered (RecordFunction stays off the dispatcher's
// path).
#include <ATen/record_function.h>

#include <memory>
#include <string>

namespace cairn {

class OpCount {
 public:
  // Null when CAIRN_COUNT_OPS is unset or empty; "{node}" in its path becomes `node` (several
  // providers of one launch, one file each).
  static std::unique_ptr<OpCount> fromEnvironment(const std::string& node);
  // Truncates PATH (BadInput naming it when it cannot be written) and starts counting.
  explicit OpCount(std::string path);
  ~OpCount();  // removes the callback and writes the file (a failure is logged, not thrown)
  OpCount(const OpCount&) = delete;
  OpCount& operator=(const OpCount&) = delete;

 private:
  std::string path_;
  at::CallbackHandle handle_;
};

}  // namespace cairn
