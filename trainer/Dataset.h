// Datasets the Root feeds the pipeline from, named in job.json `data` (docs/NODE_DATA.md):
//   idx          MNIST-style IDX files (raw: memory-mapped; gzip: unpacked) in a folder
//                (trainer/data/IdxDataset.cpp)
//   images       a folder with one folder of PNG/JPEG files per class, torchvision's ImageFolder
//                layout, decoded per batch (trainer/data/ImageFolderDataset.cpp)
//   safetensors  safetensors files (npy: folders of .npy files): named arrays, read sample by
//   npy          sample; several may feed the model's inputs in order
//                (trainer/data/ArrayDataset.cpp)
//   tokens       token id files (raw bytes or uint16/uint32 without a header, llm.c shards, 1-D
//                .npy), read sample by sample; sample i is block i of `block_length` + 1 tokens,
//                the targets shifted by one (trainer/data/TokenDataset.cpp)
// Tokens, arrays and images hold only a batch in memory (tokens widened to int64 there, never the
// file). A dataset is a list of shards (trainer/data/ShardFiles.h); with several shards each shard
// is a chunk of data.chunk.
// A Dataset returns a batch for a list of sample ids; only the Root's trainer thread uses it.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/Safetensors.h"  // readSafetensors / writeSafetensors (moved to core)
#include "trainer/TrainOptions.h"
#include "trainer/data/ShardFiles.h"

namespace cairn {

struct Batch {
  torch::Tensor inputs;  // the model's (first) input
  torch::Tensor targets;
  // The model's second, third, ... inputs (data.inputs names several tensors).
  std::vector<torch::Tensor> extra_inputs;
  // What the Root's stage takes: {inputs, extra_inputs...}.
  std::vector<torch::Tensor> modelInputs() const;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Samples `ids` (each in [0, size())), in that order. `training` enables augmentation.
  virtual Batch get(const std::vector<int64_t>& ids, bool training) const = 0;
  // The files the samples come from, in sample-id order (their `samples` add up to size()).
  virtual std::vector<ShardInfo> shards() const = 0;
  // Tensors a batch feeds the model (1 + extra_inputs.size()).
  virtual int64_t inputCount() const { return 1; }
  // Checkpoints: the augmentation cursor (training batches drawn so far; 0 for datasets without
  // augmentation), so a resumed run flips the same samples as an uninterrupted one.
  virtual uint64_t trainingDraws() const { return 0; }
  virtual void setTrainingDraws(uint64_t /*draws*/) {}
};

struct DatasetPair {
  std::unique_ptr<Dataset> train;
  std::unique_ptr<Dataset> test;  // may be null: no evaluation data
};

// Loads what `options` names; BadInput naming the file on anything missing or malformed.
// `seed` seeds augmentation.
DatasetPair loadDatasets(const DataOptions& options, uint64_t seed);

// The sizes of the training set's chunks (ShardSampler): one per shard when it has several
// (data.chunks must then be absent or equal to the shard count), else data.chunks (0: `clusters`)
// near-equal cuts.
std::vector<int64_t> chunkSizes(const Dataset& train, const DataOptions& options, int clusters);

// Reads a whole file, transparently gunzipping it when it is gzip-compressed.
std::vector<uint8_t> readMaybeGzipFile(const std::string& path);

}  // namespace cairn
