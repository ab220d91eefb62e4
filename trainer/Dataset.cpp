#include "trainer/Dataset.h"

#include <zlib.h>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/Sampler.h"
#include "trainer/data/Formats.h"

namespace cairn {

std::vector<torch::Tensor> Batch::modelInputs() const {
  std::vector<torch::Tensor> all{inputs};
  all.insert(all.end(), extra_inputs.begin(), extra_inputs.end());
  return all;
}

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
    pair = loadIdxDatasets(o, seed);
  } else if (o.format == "images") {
    pair = loadImageFolderDatasets(o, seed);
  } else if (o.format == "safetensors" || o.format == "npy") {
    pair = loadArrayDatasets(o);
  } else if (o.format == "tokens") {
    pair = loadTokenDatasets(o);
  } else {
    CAIRN_THROW(BadInput, "job.json: data.format \"", o.format,
                "\" is not idx, images, safetensors, npy or tokens");
  }
  if (pair.train->size() == 0) CAIRN_THROW(BadInput, o.location, ": the training set is empty");
  return pair;
}

std::vector<int64_t> chunkSizes(const Dataset& train, const DataOptions& o, int clusters) {
  const std::vector<ShardInfo> shards = train.shards();
  if (shards.size() <= 1) return ShardSampler::equalChunks(train.size(), o.chunks, clusters);
  if (o.chunks > 0 && o.chunks != int64_t(shards.size()))
    CAIRN_THROW(BadInput, "job.json: data.chunks is ", o.chunks, " but data.location ", o.location,
                " holds ", shards.size(),
                " shards, and with several shards each shard is a chunk (leave data.chunks out)");
  std::vector<int64_t> sizes;
  for (const ShardInfo& s : shards) sizes.push_back(s.samples);
  return sizes;
}

}  // namespace cairn
