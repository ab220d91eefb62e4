// BatchFeeder: the Root's data loading (docs/TRAINING.md "One step, as data"). It loads the
// datasets and this cluster's sampler (ShardSampler's order, or node.json's extra.deal:
// DealSampler, the plan's epoch_steps from DealSchedule), computes the run plan from them, and
// for every step takes the step's sample ids from the sampler, loads inputs and targets and cuts them into
// micro-batches; each carries its targets, sample ids and the batch's loss-term count, which
// travel downstream as "__targets", "__ids" and "__denominator" (trainer/ReservedTensors.h), so
// the Leaf never needs a data loader of its own. Records the ids (observer, sample_ids.jsonl).
// Served data (data.source "coordinator"): every chunk the deal gives this cluster from its first
// epoch on is fetched ahead (ChunkSource::start); a grown deal taken mid-run adds the chunks it
// gives this cluster besides (ChunkSource::add).
// Ownership: owns the sampler and the sample-id file; fills the borrowed DatasetPair.
// Thread-safety: one thread (the node's trainer thread).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "trainer/Dataset.h"
#include "trainer/DealSampler.h"
#include "trainer/RunPlan.h"
#include "trainer/Sampler.h"
#include "trainer/TrainerContext.h"

namespace cairn {

class BatchFeeder {
 public:
  BatchFeeder(TrainerContext& ctx, DatasetPair& data) : ctx_(ctx), data_(data) {}

  // Loads the datasets and the sampler and returns the Root's run plan (BadInput when the batch
  // does not fit this cluster's shard); opens sample_ids.jsonl when asked to record ids.
  RunPlan open();
  // The micro-batches of step `step` (0-based) into *micro, keyed 0..microbatches-1. Returns the
  // checksum of the step's sample ids.
  uint64_t load(int64_t step, std::map<int, Microbatch>* micro);
  // The deal this Root samples with (one entry {0, clusters} without node.json extra.deal).
  const std::vector<DealEntry>& deal() const { return sampler_->deal(); }
  // A running Root takes a new deal (docs/TRAINING.md "the deal"; trainer/DealChange.h decides
  // when it may): the sampler and *plan's epoch_steps, steps_per_epoch and total_steps follow it.
  // BadInput (nothing changed) when this cluster cannot run it or a shard is below one batch.
  // `dry_run`: every check and *plan as it would be, but the feeder (sampler, chunks fetched)
  // unchanged — a Root's own verdict before the Roots of all clusters agree (DealChange.h).
  void changeDeal(const std::vector<DealEntry>& deal, RunPlan* plan, bool dry_run = false);

 private:
  void openServed();  // data.source "coordinator": the dataset over the chunk table
  // … and this cluster's chunks fetched ahead, all the deal gives it from `first_epoch` on
  void startFetching(int64_t first_epoch);
  // The chunks (table rows) `sampler`'s deal gives this cluster in any epoch from `first_epoch`,
  // in the order they are first needed.
  std::vector<int64_t> dealtChunks(const DealSampler& sampler, int64_t first_epoch) const;

  TrainerContext& ctx_;
  DatasetPair& data_;
  std::vector<int64_t> chunk_sizes_;      // the chunk table the deal is dealt over
  std::unique_ptr<DealSampler> sampler_;  // one entry {0, clusters} unless node.json has a deal
  std::set<int64_t> fetching_;            // served data: the training chunks given the source
  uint64_t fetch_bytes_ = 0;              // … and their bytes with the test chunks'
  std::ofstream sample_ids_out_;
  std::vector<int64_t> epoch_order_;
  int64_t epoch_of_order_ = -1;  // the epoch epoch_order_ belongs to
};

}  // namespace cairn
