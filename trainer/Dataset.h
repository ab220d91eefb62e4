// Datasets the Root feeds the pipeline from, named in job.json `data`:
//   idx          MNIST-style IDX files (gzip or raw) in a folder: train-images-idx3-ubyte[.gz],
//                train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz],
//                t10k-labels-idx1-ubyte[.gz]; images become float (N, 1, H, W), normalised as
//                data.normalize says
//   safetensors  a tensor file holding `inputs` and `targets` (first dimension = samples); the
//                test set comes from data.test_location (or there is none)
//   tokens       a text file read as bytes; sample i is block i of `block_length` bytes (int64) and
//                its targets are the same bytes shifted by one (next-token prediction)
// A Dataset returns a batch for a list of sample ids; only the Root's trainer thread uses it.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/Safetensors.h"  // readSafetensors / writeSafetensors (moved to core)
#include "trainer/TrainOptions.h"

namespace cairn {

struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Samples `ids` (each in [0, size())), in that order. `training` enables augmentation.
  virtual Batch get(const std::vector<int64_t>& ids, bool training) const = 0;
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

// Reads a whole file, transparently gunzipping it when it is gzip-compressed.
std::vector<uint8_t> readMaybeGzipFile(const std::string& path);

}  // namespace cairn
