// Safetensors files (https://huggingface.co/docs/safetensors): the weight format of seed 000's job
// definition, used for model weights in and out of clusterize and for tensor datasets.
//
// Layout: 8 bytes little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data section; offsets are relative to its start. Reading validates everything before
// using it: header length within the file (and at most 100 MB), the header a JSON object, known
// dtype names, non-negative shapes, end - begin == elements × item size, every range inside the
// data section, ranges neither overlapping nor leaving holes (the format's rule). Any violation is
// a BadInput naming the file and, where there is one, the tensor.
// Free functions on CPU tensors; thread-safe (no shared state).
#pragma once

#include <torch/script.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cairn {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Every tensor of the file as a CPU tensor that owns its memory, in data order.
NamedTensors readSafetensors(const std::string& path);
// Where each tensor of a file lies, without reading any data (to read rows of it in place);
// validated like readSafetensors. `offset` counts from the start of the file.
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
std::vector<SafetensorsEntry> readSafetensorsIndex(const std::string& path);
// The "__metadata__" strings of a file (empty when it has none); validated like readSafetensors.
std::map<std::string, std::string> readSafetensorsMetadata(const std::string& path);

// Writes `tensors` (any device; made contiguous on the CPU) in the given order, atomically
// (temporary file + rename). Names must be unique and not "__metadata__". Tensors that share
// memory are written as separate copies.
void writeSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// "F32", "I64", ... for a torch dtype; BadInput for dtypes the format has no name for.
std::string safetensorsDtypeName(torch::ScalarType type);
// The torch dtype of a safetensors dtype name; BadInput naming `source` for unknown names.
torch::ScalarType safetensorsDtype(const std::string& name, const std::string& source);

}  // namespace cairn
