// The loaders behind loadDatasets (trainer/Dataset.h), one unit per format. Each validates its
// files and returns the training set and (when there is one) the test set; BadInput names the file.
#pragma once

#include <cstdint>

#include "trainer/Dataset.h"

namespace cairn {

DatasetPair loadIdxDatasets(const DataOptions& options, uint64_t seed);          // IdxDataset.cpp
DatasetPair loadImageFolderDatasets(const DataOptions& options, uint64_t seed);  // ImageFolder...
DatasetPair loadArrayDatasets(const DataOptions& options);  // safetensors, npy: ArrayDataset.cpp
DatasetPair loadTokenDatasets(const DataOptions& options);  // TokenDataset.cpp

}  // namespace cairn
