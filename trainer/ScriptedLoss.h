// ScriptedLoss: a loss given as a TorchScript module (job.json "loss_fn": {"torchscript": FILE}).
//
//   forward(output: Tensor, target: Tensor) -> Tuple[Tensor, Tensor | int]
//       (sum of this micro-batch's loss terms: one floating element that backward can run from,
//        number of terms: a non-negative integer)
//   count(target: Tensor) -> Tensor | int        optional (@torch.jit.export)
//       the number of terms `target` makes, without the output; absent: target.numel()
//
// Why both: the Root cuts the batch before any output exists, yet every micro-batch's loss must be
// divided by the WHOLE batch's number of terms (trainer/Loss.h), so the Root asks count() of the
// batch's targets. The Leaf checks, every micro-batch, that the count forward returns equals
// count(target): a loss whose count depends on the output (which would make the split run differ
// from the unsplit one) is refused with a message, never trained on silently.
//
// Every failure is BadInput naming job.json, the key (training_definition.loss_fn.torchscript) and
// the file. The module's parameters, if any, are not trained (it must have none that require grad).
// Thread-safety: one thread at a time (each node parses its own job.json and owns its instance).
#pragma once

#include <torch/script.h>

#include <memory>
#include <string>
#include <utility>

namespace cairn {

class ScriptedLoss {
 public:
  // Loads and checks `path`. `source` is job.json's path, `key` the dotted key that named the file.
  static std::shared_ptr<ScriptedLoss> load(const std::string& path, const std::string& source,
                                            const std::string& key);
  // The same from the file's bytes (job.json's "torchscript_base64", core/JobFiles.h); `name` is
  // the file's name for messages.
  static std::shared_ptr<ScriptedLoss> loadBytes(const std::string& bytes, const std::string& name,
                                                 const std::string& source, const std::string& key);

  // forward(output, target), checked: (sum, count).
  std::pair<torch::Tensor, int64_t> sumAndCount(const torch::Tensor& output,
                                                const torch::Tensor& target);
  // count(target), or target.numel() when the module has no count method.
  int64_t count(const torch::Tensor& target);
  // The same sum and count, with the count checked against count(target) (the Leaf's training
  // path): the sum divided by `denominator` is this micro-batch's share of the batch mean.
  torch::Tensor microbatchLoss(const torch::Tensor& output, const torch::Tensor& target,
                               double denominator);

  const std::string& path() const { return path_; }

 private:
  ScriptedLoss(torch::jit::Module module, std::string path, std::string where, bool has_count);
  static std::shared_ptr<ScriptedLoss> checked(torch::jit::Module module, const std::string& path,
                                               const std::string& where);
  int64_t toCount(const c10::IValue& value, const char* what) const;
  [[noreturn]] void fail(const std::string& what) const;

  torch::jit::Module module_;
  std::string path_;
  std::string where_;  // "job.json: training_definition.loss_fn.torchscript (loss.pt)"
  bool has_count_;
};

}  // namespace cairn
