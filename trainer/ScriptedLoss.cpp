#include "trainer/ScriptedLoss.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/Error.h"
#include "core/TensorText.h"

namespace cairn {
namespace {

std::string describeValue(const c10::IValue& v) {
  if (v.isTensor()) return "a tensor " + describeTensor(v.toTensor());
  return "a value of type " + v.type()->annotation_str();
}

// The message of a libtorch/TorchScript failure without its C++ backtrace.
std::string messageOf(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->what_without_backtrace();
  return e.what();
}

bool isTensorType(const c10::TypePtr& type) { return type->isSubtypeOf(*c10::TensorType::get()); }
bool isCountType(const c10::TypePtr& type) {
  return isTensorType(type) || type->isSubtypeOf(*c10::IntType::get());
}

}  // namespace

ScriptedLoss::ScriptedLoss(torch::jit::Module module, std::string path, std::string where,
                           bool has_count)
    : module_(std::move(module)),
      path_(std::move(path)),
      where_(std::move(where)),
      has_count_(has_count) {}

void ScriptedLoss::fail(const std::string& what) const { CAIRN_THROW(BadInput, where_, ": ", what); }

std::shared_ptr<ScriptedLoss> ScriptedLoss::load(const std::string& path, const std::string& source,
                                                 const std::string& key) {
  const std::string where = source + ": " + key + " (" + path + ")";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    CAIRN_THROW(BadInput, where, ": no such file (a relative path is read from job.json's folder)");
  if (!std::filesystem::is_regular_file(path, ec))
    CAIRN_THROW(BadInput, where, ": not a file");
  try {
    return checked(torch::jit::load(path), path, where);
  } catch (const BadInput&) {
    throw;
  } catch (const std::exception& e) {
    CAIRN_THROW(BadInput, where, ": not a TorchScript module (torch.jit.script(...).save): ",
                messageOf(e));
  }
}

std::shared_ptr<ScriptedLoss> ScriptedLoss::loadBytes(const std::string& bytes,
                                                      const std::string& name,
                                                      const std::string& source,
                                                      const std::string& key) {
  const std::string where = source + ": " + key + " (" + name + ", embedded in job.json)";
  std::istringstream in(bytes);
  try {
    return checked(torch::jit::load(in), name, where);
  } catch (const BadInput&) {
    throw;
  } catch (const std::exception& e) {
    CAIRN_THROW(BadInput, where, ": not a TorchScript module (torch.jit.script(...).save): ",
                messageOf(e));
  }
}

std::shared_ptr<ScriptedLoss> ScriptedLoss::checked(torch::jit::Module module,
                                                    const std::string& path,
                                                    const std::string& where) {
  auto forward = module.find_method("forward");
  if (!forward) CAIRN_THROW(BadInput, where, ": the module has no forward method");
  const c10::FunctionSchema& schema = forward->function().getSchema();
  const auto& args = schema.arguments();  // self, output, target, ...
  const std::string expected =
      "forward(output: Tensor, target: Tensor) -> Tuple[Tensor, Tensor] (the sum of the loss "
      "terms, their number)";
  bool args_ok = args.size() >= 3 && isTensorType(args[1].type()) && isTensorType(args[2].type());
  for (size_t i = 3; i < args.size(); ++i) args_ok = args_ok && args[i].default_value().has_value();
  if (!args_ok)
    CAIRN_THROW(BadInput, where, ": forward must be ", expected, "; it is ", schema);
  const auto& returns = schema.returns();
  const auto tuple = returns.size() == 1 ? returns[0].type()->cast<c10::TupleType>() : nullptr;
  if (!tuple || tuple->elements().size() != 2 || !isTensorType(tuple->elements()[0]) ||
      !isCountType(tuple->elements()[1]))
    CAIRN_THROW(BadInput, where, ": forward must be ", expected, " (the count may be an int); it is ",
                schema);
  bool has_count = false;
  if (auto count = module.find_method("count")) {
    const c10::FunctionSchema& c = count->function().getSchema();
    bool ok = c.arguments().size() >= 2 && isTensorType(c.arguments()[1].type()) &&
              c.returns().size() == 1 && isCountType(c.returns()[0].type());
    for (size_t i = 2; i < c.arguments().size(); ++i)
      ok = ok && c.arguments()[i].default_value().has_value();
    if (!ok)
      CAIRN_THROW(BadInput, where, ": count must be count(target: Tensor) -> Tensor | int; it is ",
                  c);
    has_count = true;
  }
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (p.value.requires_grad())
      CAIRN_THROW(BadInput, where, ": parameter \"", p.name, "\" requires grad, but a loss module's ",
                  "parameters are not trained (make it a buffer, or requires_grad_(False))");
  return std::shared_ptr<ScriptedLoss>(new ScriptedLoss(std::move(module), path, where, has_count));
}

int64_t ScriptedLoss::toCount(const c10::IValue& value, const char* what) const {
  double number = 0;
  if (value.isInt()) {
    number = double(value.toInt());
  } else if (value.isTensor() && value.toTensor().numel() == 1 &&
             !value.toTensor().is_complex()) {
    number = value.toTensor().detach().item<double>();
  } else {
    fail(std::string(what) + " must return the number of loss terms as an int or a one-element " +
         "tensor, got " + describeValue(value));
  }
  if (!(number >= 0) || number != std::floor(number) || number > 9e15)
    fail(std::string(what) + " returned " + std::to_string(number) +
         " terms: the count must be a non-negative whole number");
  return int64_t(number);
}

std::pair<torch::Tensor, int64_t> ScriptedLoss::sumAndCount(const torch::Tensor& output,
                                                            const torch::Tensor& target) {
  c10::IValue result;
  try {
    result = module_.forward({output, target});
  } catch (const std::exception& e) {
    fail("forward(output " + describeTensor(output) + ", target " + describeTensor(target) +
         ") failed: " + messageOf(e));
  }
  if (!result.isTuple() || result.toTupleRef().elements().size() != 2)
    fail("forward must return (sum, count), got " + describeValue(result));
  const auto& elements = result.toTupleRef().elements();
  if (!elements[0].isTensor() || elements[0].toTensor().numel() != 1 ||
      !elements[0].toTensor().is_floating_point())
    fail("forward's first result must be the sum of the loss terms, one floating-point element; "
         "got " + describeValue(elements[0]));
  torch::Tensor sum = elements[0].toTensor().reshape({});
  if (sum.scalar_type() == torch::kBFloat16 || sum.scalar_type() == torch::kHalf)
    sum = sum.to(torch::kFloat);
  if (torch::GradMode::is_enabled() && output.requires_grad() && !sum.requires_grad())
    fail("forward's sum does not depend on the output (detached?): backward cannot run from it");
  return {sum, toCount(elements[1], "forward")};
}

int64_t ScriptedLoss::count(const torch::Tensor& target) {
  if (!has_count_) return target.numel();
  c10::IValue result;
  try {
    result = module_.run_method("count", target);
  } catch (const std::exception& e) {
    fail("count(target " + describeTensor(target) + ") failed: " + messageOf(e));
  }
  return toCount(result, "count");
}

torch::Tensor ScriptedLoss::microbatchLoss(const torch::Tensor& output, const torch::Tensor& target,
                                           double denominator) {
  auto [sum, terms] = sumAndCount(output, target);
  const int64_t expected = count(target);
  if (terms != expected)
    fail("forward counted " + std::to_string(terms) + " loss terms, but " +
         (has_count_ ? "count(target)" : std::string("target.numel() (the module has no count)")) +
         " gives " + std::to_string(expected) + " for the same target " + describeTensor(target) +
         ": the Root divides by the batch's count before any output exists, so the count must "
         "follow from the target alone (export a count(target) method that returns it)");
  return sum / denominator;
}

}  // namespace cairn
