// The idx format: MNIST-style IDX files in a folder, train-images-idx3-ubyte[.gz],
// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]. Raw files
// are memory-mapped (the image tensor wraps the mapping, no copy); gzip files are unpacked into
// memory (a compressed stream cannot be mapped). Images go through ImageTransforms per batch.
#include <fstream>

#include "core/Error.h"
#include "trainer/data/Formats.h"
#include "trainer/data/ImageTransforms.h"
#include "trainer/data/MappedFile.h"

namespace cairn {
namespace {

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

bool isGzip(const std::string& path) {
  unsigned char magic[2] = {0, 0};
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(magic), 2);
  return magic[0] == 0x1f && magic[1] == 0x8b;
}

// An IDX file: magic 0x0000 <dtype> <ndims>, ndims big-endian uint32 sizes, then the data.
torch::Tensor readIdx(const std::string& path) {
  std::shared_ptr<MappedFile> mapped;
  std::shared_ptr<std::vector<uint8_t>> unpacked;
  const uint8_t* bytes = nullptr;
  uint64_t size = 0;
  if (isGzip(path)) {
    unpacked = std::make_shared<std::vector<uint8_t>>(readMaybeGzipFile(path));
    bytes = unpacked->data();
    size = unpacked->size();
  } else {
    mapped = std::make_shared<MappedFile>(path);
    bytes = mapped->data();
    size = mapped->size();
  }
  if (size < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08)
    CAIRN_THROW(BadInput, path, ": not an unsigned-byte IDX file (bad magic number)");
  const int dims = bytes[3];
  if (dims < 1 || dims > 4 || size < 4 + 4 * uint64_t(dims))
    CAIRN_THROW(BadInput, path, ": IDX header is truncated or has ", dims, " dimensions");
  std::vector<int64_t> shape;
  uint64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(bigEndian32(bytes + 4 + 4 * d));
    count *= uint64_t(shape.back());  // at most 4 factors below 2^32 each: checked against size
    if (count > size) count = size + 1;
  }
  const uint64_t offset = 4 + 4 * uint64_t(dims);
  if (size - offset != count)
    CAIRN_THROW(BadInput, path, ": IDX header promises ", count, " bytes of data but the file has ",
                size - offset);
  // The tensor wraps the mapping (or the unpacked bytes) and keeps it alive.
  auto owner = std::make_shared<
      std::pair<std::shared_ptr<MappedFile>, std::shared_ptr<std::vector<uint8_t>>>>(mapped,
                                                                                     unpacked);
  return torch::from_blob(
      const_cast<uint8_t*>(bytes + offset), shape, [owner](void*) mutable { owner.reset(); },
      torch::kUInt8);
}

std::string findIdx(const std::string& folder, const std::string& stem) {
  for (const std::string& candidate : {folder + "/" + stem + ".gz", folder + "/" + stem})
    if (std::ifstream(candidate).good()) return candidate;
  CAIRN_THROW(BadInput, "job.json: data.location ", folder, ": no ", stem, "[.gz] there");
}

torch::Tensor limitRows(torch::Tensor t, int64_t limit) {
  return limit > 0 && limit < t.size(0) ? t.slice(0, 0, limit) : t;
}

class IdxDataset : public Dataset {
 public:
  IdxDataset(torch::Tensor images, torch::Tensor labels, std::string path,
             const DataOptions& options, uint64_t seed)
      : images_(images.dim() == 3 ? images.unsqueeze(1) : images),
        labels_(labels.to(torch::kLong)),
        path_(std::move(path)),
        transforms_(options, images_.size(1), seed) {}
  int64_t size() const override { return images_.size(0); }
  Batch get(const std::vector<int64_t>& ids, bool training) const override {
    // The batch at once (a CNN's step on Fashion-MNIST dispatched ~1,800 operators for its 128
    // images one by one, tools/gpu/op_count.py).
    const torch::Tensor rows = torch::tensor(ids, torch::kLong);
    Batch batch{transforms_.applyBatch(images_.index_select(0, rows), ids, draws_, training, path_),
                labels_.index_select(0, rows), {}};
    if (training && transforms_.augments()) ++draws_;
    return batch;
  }
  std::vector<ShardInfo> shards() const override {
    return {{path_, size(), uint64_t(images_.numel())}};
  }
  uint64_t trainingDraws() const override { return draws_; }
  void setTrainingDraws(uint64_t draws) override { draws_ = draws; }

 private:
  torch::Tensor images_, labels_;
  std::string path_;
  ImageTransforms transforms_;
  mutable uint64_t draws_ = 0;
};

std::unique_ptr<Dataset> loadPart(const DataOptions& o, const std::string& prefix, int64_t limit,
                                  uint64_t seed) {
  const std::string images_path = findIdx(o.location, prefix + "-images-idx3-ubyte");
  const std::string labels_path = findIdx(o.location, prefix + "-labels-idx1-ubyte");
  torch::Tensor images = limitRows(readIdx(images_path), limit);
  torch::Tensor labels = limitRows(readIdx(labels_path), limit);
  if (images.size(0) != labels.size(0))
    CAIRN_THROW(BadInput, o.location, ": ", prefix, " images and labels differ in count (",
                images.size(0), " and ", labels.size(0), ")");
  if (images.dim() < 3 || labels.dim() != 1)
    CAIRN_THROW(BadInput, images_path, ": expected images (N, H, W) and labels (N)");
  return std::make_unique<IdxDataset>(images, labels, images_path, o, seed);
}

}  // namespace

DatasetPair loadIdxDatasets(const DataOptions& o, uint64_t seed) {
  DatasetPair pair;
  pair.train = loadPart(o, "train", o.train_samples, seed);
  pair.test = loadPart(o, "t10k", o.test_samples, seed);
  return pair;
}

}  // namespace cairn
