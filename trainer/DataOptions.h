// DataOptions: what job.json's "data" object says about the training data (location, format,
// chunks, per-format options, data served by the coordinator), validated in ONE place
// (parseDataOptions). Every field has its default written next to it; docs/NODE_DATA.md
// ("## job.json") describes the same fields for users. The training part of job.json is
// trainer/TrainOptions.h.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/NodeData.h"

namespace cairn {

// The bound job files give counts (samples, steps, sizes): large enough for any real run, small
// enough that sums and products of two counts stay far inside int64_t.
inline constexpr int64_t kMaxCount = int64_t{1} << 40;

// Image normalisation: x = (pixel / scale - mean) / std, per channel when lists have C entries.
struct NormalizeOptions {
  double scale = 255;  // divide raw uint8 pixels by this first
  std::vector<double> mean{0.0};
  std::vector<double> std{1.0};
};

// data.random_crop: pad every side with `padding` zero pixels, then cut a random size[0] x size[1]
// window (training); evaluation cuts the centre window of the unpadded image.
struct RandomCropOptions {
  std::vector<int64_t> size;  // [H, W]; empty: no crop
  int64_t padding = 0;
};

// One row of the chunk table of data the coordinator serves (data.source "coordinator"):
// clusterize --serve writes it into job.json as data.shards (data.test_shards for the test set;
// docs/NODE_DATA.md).
struct ServedShard {
  int64_t chunk = 0;     // its index in the table (= its chunk id)
  std::string file;      // the shard's file name on the coordinator
  uint64_t bytes = 0;
  int64_t samples = 0;   // samples the dataset takes from it (training or test)
  std::string crc32;     // "crc32:xxxxxxxx"
};

struct DataOptions {
  // idx: folder; safetensors/tokens: a file, a folder of shard files or a glob pattern; npy: a
  // folder of .npy files or of such folders (shards); images: a folder with one folder per class.
  std::string location;
  std::string format;          // idx | safetensors | npy | tokens | images
  std::string test_location;   // all but idx: optional separate test set (same forms as location)
  std::vector<int64_t> chunk;  // chunk ids to train on (empty: all); see docs/NODE_DATA.md
  int64_t chunks = 0;  // one-shard data is cut into this many chunks (0: one per cluster); with
                       // several shards each shard is a chunk
  int64_t train_samples = 0;   // > 0: use only the first N training samples (a slice)
  int64_t test_samples = 0;    // > 0: evaluate on the first N test samples only
  NormalizeOptions normalize;  // idx, images
  bool random_flip = false;    // idx, images: mirror each training image left-right with p = 0.5
  std::vector<int64_t> resize;    // idx, images: [H, W] every image is resized to (empty: none)
  RandomCropOptions random_crop;  // idx, images
  int64_t channels = 3;           // images: 3 (RGB) or 1 (grayscale), whatever the files hold
  std::vector<std::string> inputs{"inputs"};  // safetensors, npy: tensors fed to the model's
                                              // inputs, in order
  std::string targets = "targets";            // safetensors, npy: the targets tensor
  int64_t block_length = 64;   // tokens: tokens per sample
  double test_fraction = 0.1;  // tokens without test_location: the last blocks are the test set
  std::string token_dtype = "uint8";  // tokens: files without a header: uint8 | uint16 | uint32
  // "local": every Root reads `location`; "coordinator": `location` is on the coordinator's
  // machine, which serves each cluster's chunks to its Root (issue K part 2).
  std::string source = "local";
  int64_t cache_mb = 1024;          // coordinator: the Root's chunk cache bound, MiB
  std::vector<ServedShard> shards;  // coordinator: the chunk table (written by clusterize --serve)
  // coordinator with test_location: the test set's chunk table, its chunks numbered after the
  // training chunks (shards.size() + k); every cluster's Root fetches all of them
  std::vector<ServedShard> test_shards;
};

// `source` names job.json in errors ("node_data/job.json: data.chunks ...").
DataOptions parseDataOptions(const DataSpec& data, const std::string& source);

}  // namespace cairn
