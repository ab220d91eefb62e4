// Checkpoint: one node's stage state at a step boundary, written atomically and verified on read
// (docs/OPERATIONS.md "Checkpoints and resume"). Files: <dir>/step_<N>.ckpt, N = optimizer steps
// done. Written to a temporary file, fsync'd, renamed, the folder fsync'd; the newest `keep` are
// kept (later steps than the one written are deleted: a resumed run supersedes them). A file that
// is truncated or whose checksum does not match is skipped with a warning naming it, never loaded.
// Thread-safety: free functions; callers serialise writes to one folder.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace cairn {

struct CheckpointData {
  int64_t step = 0;  // optimizer steps done
  // Named tensors: "stage.<dotted name>" parameters and buffers, "optim.<i>.<field>" optimizer
  // state, "rng.<...>" generator state, "sync.<...>" ClusterSync::saveState.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  nlohmann::json meta = nlohmann::json::object();  // data cursor, sync state, job id, ...
};

// Path of the checkpoint of `step` in `dir`.
std::string checkpointPath(const std::string& dir, int64_t step);
// Writes atomically, then deletes all but the newest `keep` checkpoints in `dir` (and any of a
// later step than data.step: they belong to a run resumed from an earlier step, now superseded).
// `keep_from` >= 0 also keeps every checkpoint of a step >= keep_from (provider --join: the
// coordinator's `keep_from`, so a spare given an older uploaded checkpoint finds it held by its
// neighbours too); -1: only the newest `keep`.
void writeCheckpoint(const std::string& dir, const CheckpointData& data, int64_t keep,
                     int64_t keep_from = -1);
// Deletes the checkpoints in `dir` of a step later than `step` (a run resumed from `step` trains
// those steps again: the files are of the abandoned run); returns their steps.
std::vector<int64_t> removeCheckpointsAfter(const std::string& dir, int64_t step);
// Steps of the checkpoints in `dir` that verify, ascending (corrupt ones skipped with a warning;
// a missing folder gives none).
std::vector<int64_t> validCheckpointSteps(const std::string& dir);
// Reads and verifies one checkpoint; BadInput naming the file when it is missing or corrupt.
CheckpointData readCheckpoint(const std::string& dir, int64_t step);
// This process's name as a checkpoint's writer (16 random hex digits, drawn once per process): a
// trainer stores it in the meta's "writer", and a resume from a checkpoint whose writer is another
// process (a spare resuming a lost node's, a provider started again) knows the weights it loads
// were not in this process's memory before (ClusterSync::setResumedFromAnotherProcess).
const std::string& thisProcessAsWriter();

// Copies the checkpoint tensors "stage.<name>" in `by_name` into the stage's parameters, then
// buffers, of the same names, shapes and dtypes, taking them out of `by_name`; BadInput naming
// `path` when one is missing or does not fit, or a "stage." tensor is left over (not this stage's).
void restoreStageWeights(torch::jit::Module& module, std::map<std::string, torch::Tensor>* by_name,
                         const std::string& path);
// The same from a whole checkpoint: `stage` then holds the weights a node that wrote `data` had
// (the coordinator makes a lost node's trained stage from its final checkpoint).
void loadStageWeights(torch::jit::Module& stage, const CheckpointData& data, const std::string& source);

}  // namespace cairn
