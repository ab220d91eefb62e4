#include "clusterize/InitialWeights.h"

#include <map>
#include <sstream>

#include "core/Error.h"
#include "core/Safetensors.h"

namespace cairn::clusterize {
namespace {

std::string shapeText(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

// Safetensors' dtype names on both sides, since the file uses them; torch's name for dtypes the
// format cannot hold (a complex parameter, say).
std::string dtypeText(const torch::Tensor& t) {
  try {
    return safetensorsDtypeName(t.scalar_type());
  } catch (const BadInput&) {
    return c10::toString(t.scalar_type());
  }
}

using TensorsByName = std::map<std::string, torch::Tensor>;

// Names the model ties to one tensor that the file gives different values (shape and dtype
// mismatches are reported on their own).
std::vector<std::string> tiedConflicts(
    const std::map<const c10::TensorImpl*, std::vector<std::string>>& aliases,
    const TensorsByName& in_file) {
  std::vector<std::string> tied;
  for (const auto& [impl, names] : aliases) {
    const torch::Tensor* first = nullptr;
    std::string first_name;
    for (const auto& name : names) {
      const auto it = in_file.find(name);
      if (it == in_file.end()) continue;
      const torch::Tensor& t = it->second;
      if (first == nullptr) {
        first = &t;
        first_name = name;
      } else if (t.sizes() == first->sizes() && t.scalar_type() == first->scalar_type() &&
                 !torch::equal(t, *first)) {
        tied.push_back("tied: " + inQuotes(first_name) + " and " + inQuotes(name) +
                       " are one tensor in the model but differ in the file");
      }
    }
  }
  return tied;
}

// One BadInput listing every mismatch, one per line.
[[noreturn]] void throwMismatches(const std::vector<std::string>& problems,
                                  const std::string& weights_path,
                                  const std::string& model_source) {
  std::ostringstream message;
  message << weights_path << " does not fit " << model_source << " (" << problems.size()
          << (problems.size() == 1 ? " mismatch):" : " mismatches):");
  for (const auto& line : problems) message << "\n  " << line;
  CAIRN_THROW(BadInput, message.str());
}

}  // namespace

void loadInitialWeights(torch::jit::Module& model, const std::string& weights_path,
                        const std::string& model_source) {
  const NamedTensors file = readSafetensors(weights_path);
  TensorsByName in_file(file.begin(), file.end());

  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& p : model.named_parameters(true)) state.emplace_back(p.name, p.value);
  for (const auto& b : model.named_buffers(true)) state.emplace_back(b.name, b.value);
  std::map<const c10::TensorImpl*, std::vector<std::string>> aliases;  // tied names per tensor
  TensorsByName in_model;
  for (const auto& [name, t] : state) {
    aliases[t.unsafeGetTensorImpl()].push_back(name);
    in_model[name] = t;
  }

  std::vector<std::string> missing, unknown, shapes, dtypes;
  for (const auto& [name, t] : state) {
    const auto it = in_file.find(name);
    if (it == in_file.end()) {
      bool alias_given = false;
      for (const auto& alias : aliases[t.unsafeGetTensorImpl()])
        alias_given |= in_file.count(alias) > 0;
      if (!alias_given)
        missing.push_back("missing in file: " + inQuotes(name) + " (the model's is " +
                          dtypeText(t) + " " + shapeText(t) + ")");
      continue;
    }
    const torch::Tensor& given = it->second;
    if (given.sizes() != t.sizes())
      shapes.push_back("shape: " + inQuotes(name) + " is " + shapeText(given) + " in the file, " +
                       shapeText(t) + " in the model");
    if (given.scalar_type() != t.scalar_type())
      dtypes.push_back("dtype: " + inQuotes(name) + " is " + dtypeText(given) + " in the file, " +
                       dtypeText(t) + " in the model");
  }
  for (const auto& [name, t] : file)
    if (!in_model.count(name))
      unknown.push_back("unknown name: " + inQuotes(name) + " (" + dtypeText(t) + " " +
                        shapeText(t) + ") is not a parameter or buffer of the model");
  std::vector<std::string> tied = tiedConflicts(aliases, in_file);

  std::vector<std::string> problems;
  for (auto* list : {&missing, &unknown, &shapes, &dtypes, &tied})
    problems.insert(problems.end(), list->begin(), list->end());
  if (!problems.empty()) throwMismatches(problems, weights_path, model_source);

  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : state) {
    const auto it = in_file.find(name);
    if (it != in_file.end()) t.copy_(it->second);
  }
}

}  // namespace cairn::clusterize
