#include "clusterize/ExampleInputs.h"

#include <fstream>
#include <iterator>

#include <torch/csrc/jit/serialization/pickle.h>

#include "clusterize/Profiler.h"
#include "core/Error.h"

namespace cairn::clusterize {

std::vector<int64_t> parseShape(const std::string& text, const std::string& flag) {
  std::vector<int64_t> shape;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || value <= 0 || value > (int64_t{1} << 31))
      CAIRN_THROW(BadInput, flag, " must be positive integers separated by commas, e.g. 64,1,28,28 (got \"",
                  text, "\")");
    shape.push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return shape;
}

std::vector<c10::IValue> makeExampleInputs(const std::vector<std::vector<int64_t>>& shapes,
                                           const std::vector<std::string>& dtypes, uint64_t seed) {
  if (shapes.empty()) CAIRN_THROW(BadInput, "give --input-shape (once per model input) or --example");
  if (dtypes.size() != 1 && dtypes.size() != shapes.size())
    CAIRN_THROW(BadInput, "--input-dtype is given ", dtypes.size(), " times for ", shapes.size(),
                " --input-shape; give it once for all inputs or once per input");
  auto generator = at::detail::createCPUGenerator(seed);
  std::vector<c10::IValue> inputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const c10::ScalarType dtype = parseDtype(dtypes.size() == 1 ? dtypes[0] : dtypes[i]);
    const auto options = at::TensorOptions().dtype(dtype);
    if (c10::isFloatingType(dtype)) {
      inputs.emplace_back(at::randn(shapes[i], generator, at::TensorOptions().dtype(at::kFloat)).to(dtype));
    } else {
      inputs.emplace_back(at::zeros(shapes[i], options));
    }
  }
  return inputs;
}

std::vector<c10::IValue> loadExampleInputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot open the --example file");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const std::exception& e) {
    CAIRN_THROW(BadInput, path, ": not a file written by torch.save: ", e.what());
  }
  if (value.isTensor()) return {value};
  std::vector<c10::IValue> inputs;
  if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) inputs.push_back(e);
  } else if (value.isList()) {
    for (const auto& e : value.toListRef()) inputs.push_back(e);
  } else {
    CAIRN_THROW(BadInput, path, ": expected a tensor or a tuple/list of inputs, got ", value.tagKind());
  }
  if (inputs.empty()) CAIRN_THROW(BadInput, path, ": holds no inputs");
  return inputs;
}

}  // namespace cairn::clusterize
