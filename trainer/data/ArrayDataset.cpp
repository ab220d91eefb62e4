// The safetensors and npy formats: named arrays whose first dimension is the sample, in shards.
//   safetensors  a shard is one .safetensors file holding (at least) the tensors data.inputs and
//                data.targets name; data.location is a file, a folder of .safetensors files or a
//                glob pattern
//   npy          a shard is a folder holding <name>.npy for each of those names; data.location is
//                such a folder, a folder of such folders, or a glob pattern matching them
// Every shard stays on disk; a batch reads the rows it needs straight into its tensors
// (trainer/data/FileReader.h), in any dtype the wire carries (float32/16/64, bfloat16 (safetensors
// only), int64, int32, uint8, bool). All shards must agree on each tensor's dtype and per-sample
// shape. data.inputs (default ["inputs"]) are fed to the model's
// inputs in that order.
#include <algorithm>
#include <cstring>
#include <map>

#include "core/Error.h"
#include "trainer/data/FileReader.h"
#include "trainer/data/Formats.h"
#include "trainer/data/Npy.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

bool onTheWire(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat:
    case torch::kHalf:
    case torch::kBFloat16:
    case torch::kDouble:
    case torch::kLong:
    case torch::kInt:
    case torch::kByte:
    case torch::kBool:
      return true;
    default:
      return false;
  }
}

// One named array of one shard, in place.
struct Array {
  std::shared_ptr<FileReader> file;
  uint64_t offset = 0;  // of row 0
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;  // [samples, ...]
  uint64_t row_bytes = 0;
};

struct Shard {
  std::string path;
  uint64_t bytes = 0;
  std::vector<Array> arrays;  // data.inputs..., then data.targets
  int64_t samples = 0;
};

std::vector<std::string> arrayNames(const DataOptions& o) {
  std::vector<std::string> names = o.inputs;
  names.push_back(o.targets);
  return names;
}

Array arrayAt(std::shared_ptr<FileReader> file, uint64_t offset, torch::ScalarType dtype,
              std::vector<int64_t> shape, const std::string& where) {
  if (!onTheWire(dtype))
    CAIRN_THROW(BadInput, where, " has dtype ", c10::toString(dtype),
                ", which the wire does not carry (float32/16/64, bfloat16, int64, int32, uint8, "
                "bool)");
  if (shape.empty())
    CAIRN_THROW(BadInput, where, " is a scalar; its first dimension must be the sample");
  Array a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.row_bytes = c10::elementSize(dtype);
  for (size_t d = 1; d < a.shape.size(); ++d) a.row_bytes *= uint64_t(a.shape[d]);
  if (offset > file->size() || a.row_bytes * uint64_t(a.shape[0]) > file->size() - offset)
    CAIRN_THROW(BadInput, where, " lies beyond the end of the file");
  a.offset = offset;
  a.file = std::move(file);
  return a;
}

Shard openSafetensorsShard(const std::string& path, const DataOptions& o) {
  Shard s;
  s.path = path;
  std::map<std::string, SafetensorsEntry> entries;
  for (SafetensorsEntry& e : readSafetensorsIndex(path)) entries.emplace(e.name, e);
  auto file = std::make_shared<FileReader>(path);
  s.bytes = file->size();
  for (const std::string& name : arrayNames(o)) {
    auto it = entries.find(name);
    if (it == entries.end())
      CAIRN_THROW(BadInput, path, ": has no tensor \"", name, "\" (data.inputs ",
                  "and data.targets name the tensors to read)");
    s.arrays.push_back(arrayAt(file, it->second.offset, it->second.dtype, it->second.shape,
                               path + ": tensor \"" + name + "\""));
  }
  return s;
}

Shard openNpyShard(const std::string& folder, const DataOptions& o) {
  Shard s;
  s.path = folder;
  for (const std::string& name : arrayNames(o)) {
    const std::string path = (fs::path(folder) / (name + ".npy")).string();
    if (!fs::is_regular_file(path))
      CAIRN_THROW(BadInput, folder, ": has no ", name, ".npy (data.inputs and data.targets name ",
                  "the arrays to read)");
    auto file = std::make_shared<FileReader>(path);
    const NpyArray npy = readNpyHeader(*file);
    const auto dtype = wireDtypeOf(npy);
    if (!dtype)
      CAIRN_THROW(BadInput, path, ": dtype '", npy.descr, "' is not one the wire carries ",
                  "(float16/32/64, int32, int64, uint8, bool); convert it with numpy's astype");
    s.bytes += file->size();
    s.arrays.push_back(arrayAt(file, npy.data_offset, *dtype, npy.shape, path));
  }
  return s;
}

// The shard folders of an npy location: the folder itself when it holds .npy files, else its
// sub-folders (a glob pattern: the folders it matches).
std::vector<std::string> npyShardFolders(const std::string& location, const std::string& key) {
  auto holdsNpy = [](const fs::path& folder) {
    std::error_code error;
    for (const fs::directory_entry& e : fs::directory_iterator(folder, error))
      if (e.is_regular_file() && hasSuffix(e.path().filename().string(), {".npy"})) return true;
    return false;
  };
  if (location.find_first_of("*?[") == std::string::npos && fs::is_directory(location) &&
      holdsNpy(location))
    return {location};
  return expandLocation(location, key, [&](const fs::directory_entry& e) {
    return e.is_directory() && holdsNpy(e.path());
  });
}

class ArrayDataset : public Dataset {
 public:
  // `limit` > 0: the first `limit` samples only (shards past it are left out).
  ArrayDataset(std::vector<Shard> shards, int64_t limit) {
    const std::string first_path = shards.front().path;
    begins_.push_back(0);
    for (Shard& s : shards) {
      if (limit > 0) s.samples = std::min(s.samples, limit - begins_.back());
      if (s.samples <= 0) continue;
      begins_.push_back(begins_.back() + s.samples);
      shards_.push_back(std::move(s));
    }
    if (shards_.empty()) CAIRN_THROW(BadInput, first_path, ": holds no sample");
  }
  int64_t size() const override { return begins_.back(); }
  int64_t inputCount() const override { return int64_t(shards_.front().arrays.size()) - 1; }
  Batch get(const std::vector<int64_t>& ids, bool /*training*/) const override {
    const std::vector<Array>& first = shards_.front().arrays;
    std::vector<torch::Tensor> out;
    for (const Array& a : first) {
      std::vector<int64_t> shape = a.shape;
      shape[0] = int64_t(ids.size());
      out.push_back(torch::empty(shape, torch::TensorOptions().dtype(a.dtype)));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      CAIRN_ENFORCE(ids[i] >= 0 && ids[i] < size(), "sample id ", ids[i], " of ", size());
      const size_t k =
          size_t(std::upper_bound(begins_.begin(), begins_.end(), ids[i]) - begins_.begin() - 1);
      const Shard& s = shards_[k];
      const int64_t row = ids[i] - begins_[k];
      for (size_t n = 0; n < out.size(); ++n) {
        const Array& a = s.arrays[n];
        a.file->read(a.offset + uint64_t(row) * a.row_bytes, a.row_bytes,
                     static_cast<uint8_t*>(out[n].data_ptr()) + i * a.row_bytes, "a sample");
      }
    }
    Batch b;
    b.targets = out.back();
    out.pop_back();
    b.inputs = out.front();
    b.extra_inputs.assign(out.begin() + 1, out.end());
    return b;
  }
  std::vector<ShardInfo> shards() const override {
    std::vector<ShardInfo> out;
    for (const Shard& s : shards_) out.push_back({s.path, s.samples, s.bytes});
    return out;
  }

 private:
  std::vector<Shard> shards_;
  std::vector<int64_t> begins_;
};

std::unique_ptr<Dataset> loadArrays(const std::string& location, const std::string& key,
                                    const DataOptions& o, int64_t limit) {
  const bool npy = o.format == "npy";
  const std::vector<std::string> paths =
      npy ? npyShardFolders(location, key)
          : expandLocation(location, key, [](const fs::directory_entry& e) {
              return e.is_regular_file() &&
                     hasSuffix(e.path().filename().string(), {".safetensors"});
            });
  const std::vector<std::string> names = arrayNames(o);
  reserveOpenFiles(paths.size() * (npy ? names.size() : 1), location);
  std::vector<Shard> shards;
  for (const std::string& path : paths) {
    Shard s = npy ? openNpyShard(path, o) : openSafetensorsShard(path, o);
    s.samples = s.arrays.front().shape[0];
    for (size_t n = 0; n < names.size(); ++n) {
      const Array& a = s.arrays[n];
      if (a.shape[0] != s.samples)
        CAIRN_THROW(BadInput, path, ": \"", names[n], "\" has ", a.shape[0], " samples but \"",
                    names[0], "\" has ", s.samples, " (the first dimension is the sample)");
      if (shards.empty()) continue;
      const Array& ref = shards.front().arrays[n];
      const std::vector<int64_t> per_sample(a.shape.begin() + 1, a.shape.end());
      const std::vector<int64_t> ref_per_sample(ref.shape.begin() + 1, ref.shape.end());
      if (a.dtype != ref.dtype || per_sample != ref_per_sample)
        CAIRN_THROW(BadInput, path, ": \"", names[n], "\" is ", c10::toString(a.dtype), " ",
                    c10::IntArrayRef(a.shape), " but in ", shards.front().path, " it is ",
                    c10::toString(ref.dtype), " ", c10::IntArrayRef(ref.shape),
                    " (shards must agree on dtype and per-sample shape)");
    }
    shards.push_back(std::move(s));
  }
  return std::make_unique<ArrayDataset>(std::move(shards), limit);
}

}  // namespace

DatasetPair loadArrayDatasets(const DataOptions& o) {
  DatasetPair pair;
  pair.train = loadArrays(o.location, "data.location", o, o.train_samples);
  if (!o.test_location.empty())
    pair.test = loadArrays(o.test_location, "data.test_location", o, o.test_samples);
  return pair;
}

}  // namespace cairn
