// ModelMerge: gets the trained model back. Reads node_data/plan.json, loads every placed node's
// nodes/<name>/trained_stage.pt (written by the provider at the end of training: the stage module
// with trained values, parameters and buffers under the model's original dotted names) and writes
// those values into the ORIGINAL TorchScript model, so the result loads with torch.jit.load /
// torch::jit::load like the model clusterize was given.
//
// One cluster's values (MergeOptions::cluster), or by default the combination over all clusters:
// floating-point tensors are averaged element-wise (in float64, then cast back); integer and bool
// tensors (e.g. BatchNorm's num_batches_tracked) take the element-wise maximum, i.e. the most
// batches any cluster counted. In each cluster every parameter and buffer a stage uses must come
// from exactly one trained_stage.pt with the model's shape and dtype; anything else is a BadInput
// naming the node, the file and the tensor. State no stage holds (never read by forward) is not
// trained and keeps the model file's value. Not thread-safe; a plain function of files.
#pragma once

#include <torch/script.h>

#include <optional>
#include <string>
#include <vector>

#include "core/Safetensors.h"

namespace cairn::clusterize {

struct MergeOptions {
  std::string node_data;       // folder holding plan.json and nodes/<name>/trained_stage.pt
  std::string model_path;      // the original model; empty: plan.json's "model"
  std::optional<int> cluster;  // take this cluster's values; empty: combine all clusters
};

enum class MergeFormat { kTorchScript, kSafetensors };
MergeFormat parseMergeFormat(const std::string& text);  // "torchscript" | "safetensors"

struct MergedModel {
  torch::jit::Module model;            // the original model holding the trained values
  NamedTensors state;                  // its parameters, then buffers, under their original names
  std::vector<int> clusters;           // clusters whose values went in
  std::vector<std::string> untouched;  // state no stage holds: kept from the model file
};

// The file name a provider writes its trained stage to, inside its node folder.
constexpr const char* kTrainedStageFile = "trained_stage.pt";

MergedModel mergeTrainedStages(const MergeOptions& options);

// Writes atomically: TorchScript (Module::save) or safetensors holding `state` (metadata
// {"format": "pt"}, as Hugging Face tools expect).
void saveMergedModel(const MergedModel& merged, const std::string& path, MergeFormat format);

}  // namespace cairn::clusterize
