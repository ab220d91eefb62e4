#include "trainer/Dataset.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {
namespace {

bool fileExists(const std::string& path) { return std::ifstream(path).good(); }

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// An IDX file: magic 0x0000 <dtype> <ndims>, ndims big-endian uint32 sizes, then the data.
torch::Tensor readIdx(const std::string& path) {
  std::vector<uint8_t> bytes = readMaybeGzipFile(path);
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08)
    CAIRN_THROW(BadInput, path, ": not an unsigned-byte IDX file (bad magic number)");
  const int dims = bytes[3];
  if (dims < 1 || dims > 4 || bytes.size() < 4 + 4 * size_t(dims))
    CAIRN_THROW(BadInput, path, ": IDX header is truncated or has ", dims, " dimensions");
  std::vector<int64_t> shape;
  int64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(bigEndian32(&bytes[4 + 4 * d]));
    count *= shape.back();
  }
  const size_t offset = 4 + 4 * size_t(dims);
  if (bytes.size() - offset != size_t(count))
    CAIRN_THROW(BadInput, path, ": IDX header promises ", count, " bytes of data but the file has ",
                bytes.size() - offset);
  torch::Tensor t = torch::empty(shape, torch::kUInt8);
  std::memcpy(t.data_ptr(), bytes.data() + offset, size_t(count));
  return t;
}

std::string findIdx(const std::string& folder, const std::string& stem) {
  for (const std::string& candidate : {folder + "/" + stem + ".gz", folder + "/" + stem})
    if (fileExists(candidate)) return candidate;
  CAIRN_THROW(BadInput, "job.json: data.location ", folder, ": no ", stem, "[.gz] there");
}

class TensorDataset : public Dataset {
 public:
  TensorDataset(torch::Tensor inputs, torch::Tensor targets) : inputs_(inputs), targets_(targets) {}
  int64_t size() const override { return inputs_.size(0); }
  Batch get(const std::vector<int64_t>& ids, bool training) const override {
    torch::Tensor index = torch::tensor(ids, torch::kLong);
    return {inputs_.index_select(0, index), targets_.index_select(0, index)};
  }

 protected:
  torch::Tensor inputs_, targets_;
};

class ImageDataset : public Dataset {
 public:
  ImageDataset(torch::Tensor images, torch::Tensor labels, const NormalizeOptions& normalize,
               bool random_flip, uint64_t seed)
      : images_(images.dim() == 3 ? images.unsqueeze(1) : images),
        labels_(labels.to(torch::kLong)),
        normalize_(normalize),
        random_flip_(random_flip),
        seed_(seed) {
    const int64_t channels = images_.size(1);
    auto per_channel = [&](const std::vector<double>& v, const char* what) {
      if (v.size() != 1 && int64_t(v.size()) != channels)
        CAIRN_THROW(BadInput, "job.json: data.normalize.", what, " has ", v.size(),
                    " values for images with ", channels, " channel(s)");
      std::vector<float> f(v.begin(), v.end());
      return torch::tensor(f).view({-1, 1, 1});
    };
    mean_ = per_channel(normalize.mean, "mean");
    std_ = per_channel(normalize.std, "std");
  }
  int64_t size() const override { return images_.size(0); }
  Batch get(const std::vector<int64_t>& ids, bool training) const override {
    torch::Tensor index = torch::tensor(ids, torch::kLong);
    torch::Tensor x = images_.index_select(0, index).to(torch::kFloat);
    x = (x / float(normalize_.scale) - mean_) / std_;
    if (training && random_flip_) {
      // A flip decision per (sample id, draw): reproducible whatever the batch composition.
      std::vector<int64_t> flip;
      for (size_t i = 0; i < ids.size(); ++i) {
        std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + uint64_t(ids[i]) * 31 + draws_);
        if (rng() & 1) flip.push_back(int64_t(i));
      }
      ++draws_;
      if (!flip.empty()) {
        torch::Tensor rows = torch::tensor(flip, torch::kLong);
        x.index_copy_(0, rows, x.index_select(0, rows).flip({3}));
      }
    }
    return {x.contiguous(), labels_.index_select(0, index)};
  }
  uint64_t trainingDraws() const override { return draws_; }
  void setTrainingDraws(uint64_t draws) override { draws_ = draws; }

 private:
  torch::Tensor images_, labels_, mean_, std_;
  NormalizeOptions normalize_;
  bool random_flip_;
  uint64_t seed_;
  mutable uint64_t draws_ = 0;
};

class TokenDataset : public Dataset {
 public:
  TokenDataset(torch::Tensor bytes, int64_t block_length)
      : bytes_(bytes.to(torch::kLong)), block_(block_length) {
    count_ = bytes_.numel() > block_ ? (bytes_.numel() - 1) / block_ : 0;
  }
  int64_t size() const override { return count_; }
  Batch get(const std::vector<int64_t>& ids, bool training) const override {
    torch::Tensor starts = torch::tensor(ids, torch::kLong).mul(block_).unsqueeze(1);
    torch::Tensor positions = starts + torch::arange(block_, torch::kLong).unsqueeze(0);
    return {bytes_.index({positions}), bytes_.index({positions + 1})};
  }

 private:
  torch::Tensor bytes_;
  int64_t block_;
  int64_t count_;
};

torch::Tensor limitRows(torch::Tensor t, int64_t limit) {
  return limit > 0 && limit < t.size(0) ? t.slice(0, 0, limit) : t;
}

std::pair<torch::Tensor, torch::Tensor> readInputsTargets(const std::string& path) {
  torch::Tensor inputs, targets;
  for (auto& [name, tensor] : readSafetensors(path)) {
    if (name == "inputs") inputs = tensor;
    if (name == "targets") targets = tensor;
  }
  if (!inputs.defined() || !targets.defined())
    CAIRN_THROW(BadInput, path, ": a tensor file needs tensors named \"inputs\" and \"targets\"");
  if (inputs.dim() == 0 || targets.dim() == 0 || inputs.size(0) != targets.size(0))
    CAIRN_THROW(BadInput, path, ": inputs and targets must have the same first dimension (got ",
                inputs.sizes(), " and ", targets.sizes(), ")");
  return {inputs, targets};
}

torch::Tensor readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot open (job.json data.location)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  torch::Tensor t = torch::empty({int64_t(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

std::vector<uint8_t> readMaybeGzipFile(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");  // reads uncompressed files transparently too
  if (!file) CAIRN_THROW(BadInput, path, ": cannot open");
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    const int n = gzread(file, chunk.data(), unsigned(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(file, &code);
      gzclose(file);
      CAIRN_THROW(BadInput, path, ": cannot read: ", message);
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(file);
  return out;
}


DatasetPair loadDatasets(const DataOptions& o, uint64_t seed) {
  DatasetPair pair;
  if (o.format == "idx") {
    torch::Tensor train_images =
        limitRows(readIdx(findIdx(o.location, "train-images-idx3-ubyte")), o.train_samples);
    torch::Tensor train_labels =
        limitRows(readIdx(findIdx(o.location, "train-labels-idx1-ubyte")), o.train_samples);
    if (train_images.size(0) != train_labels.size(0))
      CAIRN_THROW(BadInput, o.location, ": train images and labels differ in count");
    pair.train = std::make_unique<ImageDataset>(train_images, train_labels, o.normalize,
                                                o.random_flip, seed);
    torch::Tensor test_images =
        limitRows(readIdx(findIdx(o.location, "t10k-images-idx3-ubyte")), o.test_samples);
    torch::Tensor test_labels =
        limitRows(readIdx(findIdx(o.location, "t10k-labels-idx1-ubyte")), o.test_samples);
    if (test_images.size(0) != test_labels.size(0))
      CAIRN_THROW(BadInput, o.location, ": test images and labels differ in count");
    pair.test = std::make_unique<ImageDataset>(test_images, test_labels, o.normalize, false, seed);
  } else if (o.format == "safetensors") {
    auto [inputs, targets] = readInputsTargets(o.location);
    pair.train = std::make_unique<TensorDataset>(limitRows(inputs, o.train_samples),
                                                 limitRows(targets, o.train_samples));
    if (!o.test_location.empty()) {
      auto [test_inputs, test_targets] = readInputsTargets(o.test_location);
      pair.test = std::make_unique<TensorDataset>(limitRows(test_inputs, o.test_samples),
                                                  limitRows(test_targets, o.test_samples));
    }
  } else if (o.format == "tokens") {
    torch::Tensor bytes = readBytes(o.location);
    if (!o.test_location.empty()) {
      pair.train = std::make_unique<TokenDataset>(bytes, o.block_length);
      pair.test = std::make_unique<TokenDataset>(readBytes(o.test_location), o.block_length);
    } else {
      const int64_t blocks = bytes.numel() > 1 ? (bytes.numel() - 1) / o.block_length : 0;
      const int64_t test_blocks = int64_t(double(blocks) * o.test_fraction);
      const int64_t split = (blocks - test_blocks) * o.block_length;
      pair.train = std::make_unique<TokenDataset>(bytes.slice(0, 0, split + 1), o.block_length);
      if (test_blocks > 0)
        pair.test = std::make_unique<TokenDataset>(bytes.slice(0, split), o.block_length);
    }
    if (pair.train->size() == 0)
      CAIRN_THROW(BadInput, o.location, ": shorter than one block of ", o.block_length, " bytes");
  } else {
    CAIRN_THROW(BadInput, "job.json: data.format \"", o.format,
                "\" is not idx, safetensors or tokens");
  }
  if (o.format != "idx" && o.train_samples > 0 && o.format == "tokens")
    CAIRN_WARN("data.train_samples is ignored for the tokens format");
  if (pair.train->size() == 0) CAIRN_THROW(BadInput, o.location, ": the training set is empty");
  return pair;
}

}  // namespace cairn
