// RingCheckpoint: the checkpoint state of a node's rings. Tensors: per ring and DiLoCo bucket i,
// "sync.<ring>.previous.<i>" (θ_prev, flat) and "sync.<ring>.momentum.<i>" (the outer momentum,
// once it exists); meta (the trainer keeps it under the checkpoint's "sync" key):
// {"last_synced_step", "mode", "rings": {id: {"generation", "view"}}}. Loading keeps the "sync.*"
// tensors aside until start() has built the buckets, then checks names, dtypes and sizes against
// them (BadInput naming the tensor).
//
// Ownership: none (reads and writes RingClusterSync's rings). Thread-safety: the trainer's thread,
// while no ring thread runs.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "node/ring/RingState.h"

namespace cairn {

void saveRingState(const std::vector<std::unique_ptr<Ring>>& rings, const RingContext& context,
                   std::vector<std::pair<std::string, torch::Tensor>>* tensors,
                   nlohmann::json* meta);
// Keeps the "sync.*" tensors in `loaded`; reads "last_synced_step" into `last_synced_step`.
void loadRingState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                   const nlohmann::json& meta, std::map<std::string, torch::Tensor>* loaded,
                   int64_t* last_synced_step);
// DiLoCo outer state from a checkpoint: replaces the θ_prev taken from the stage with `loaded`'s
// tensors of `ring`, and takes them out of `loaded`.
void applyLoadedState(Ring& ring, SyncMode mode, std::map<std::string, torch::Tensor>* loaded);

}  // namespace cairn
