// DealSampler: which training samples a cluster sees when the number of clusters changes during a
// run (issue [J] "Growing": the coordinator forms a new cluster as volunteers arrive and deals the
// listed chunks over more clusters from some epoch on).
// The deal is a history of entries {from_epoch E, clusters n}: from epoch E (until the next
// entry's from_epoch) the listed chunks are dealt round robin over n clusters exactly as
// ShardSampler deals them over a fixed number, and each epoch's order is ShardSampler's order for
// that (cluster, n, epoch). So within every epoch the clusters' shards are disjoint and cover the
// listed chunks, and a deal of one entry {0, n} gives exactly today's ShardSampler (the static flow
// is unchanged bit for bit). A cluster that does not exist yet in an epoch (cluster >= n) has an
// empty shard there.
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainer/Sampler.h"

namespace cairn {

struct DealEntry {
  int64_t from_epoch = 0;
  int clusters = 1;
  bool operator==(const DealEntry& o) const {
    return from_epoch == o.from_epoch && clusters == o.clusters;
  }
};

// BadInput naming `where`[i].<field> unless: at least one entry, the first from epoch 0,
// from_epoch strictly increasing, clusters >= 1.
void validateDeal(const std::vector<DealEntry>& deal, const std::string& where);
// A deal from JSON [{"from_epoch":E,"clusters":n},…] (node.json extra.deal); BadInput naming
// `where`[i].<field> when it is not one.
std::vector<DealEntry> dealFromJson(const nlohmann::json& json, const std::string& where);
// The deal as that JSON (checkpoint meta, logs, metrics).
nlohmann::json dealToJson(const std::vector<DealEntry>& deal);
// node.json's `extra` with `deal` in force: extra.deal is it, and no extra.offered_deal is left
// (the Root that takes an offer, the coordinator once every Root took it, a resume that adopts it).
void putDealInForce(nlohmann::json& extra, const nlohmann::json& deal);
// The deal entries in force at epochs 0..epoch (those with from_epoch <= epoch).
std::vector<DealEntry> dealUpTo(const std::vector<DealEntry>& deal, int64_t epoch);
// What a trainer can run (BadInput naming `where`): `cluster` is in the deal at some entry,
// and clusters are only ever added (a cluster never leaves the deal). Returns the epoch this
// cluster first trains in (0, or the from_epoch of the entry that adds it).
int64_t checkDealForCluster(const std::vector<DealEntry>& deal, int cluster,
                            const std::string& where);

class DealSampler {
 public:
  // Chunk k holds the next chunk_sizes[k] samples; chunk_ids as ShardSampler's (empty: all).
  DealSampler(const std::vector<int64_t>& chunk_sizes, int cluster, std::vector<DealEntry> deal,
              const std::vector<int64_t>& chunk_ids, uint64_t seed);
  // The entry in force at `epoch` (epoch >= 0).
  const DealEntry& entryAt(int64_t epoch) const;
  // This cluster's shard in `epoch` (ids in order); empty when the cluster does not exist then.
  const std::vector<int64_t>& shard(int64_t epoch) const;
  // The shard in this epoch's order (ShardSampler::epochOrder of the entry in force).
  std::vector<int64_t> epochOrder(int64_t epoch) const;
  const std::vector<DealEntry>& deal() const { return deal_; }

 private:
  size_t entryIndex(int64_t epoch) const;
  std::vector<DealEntry> deal_;
  std::vector<ShardSampler> samplers_;  // one per entry, or none where cluster >= clusters
  std::vector<bool> present_;
};

// A run's steps per epoch as a table: from epoch `from_epoch` on (until the next entry), every
// epoch has `steps` optimizer steps. Steps are numbered run-wide from 0.
struct EpochSteps {
  int64_t from_epoch = 0;
  int64_t steps = 1;
  bool operator==(const EpochSteps& o) const {
    return from_epoch == o.from_epoch && steps == o.steps;
  }
};
// BadInput naming `where`[i].<field> unless: at least one entry, the first from epoch 0,
// from_epoch strictly increasing, steps >= 1.
void validateEpochSteps(const std::vector<EpochSteps>& table, const std::string& where);
// The epoch of step `step` (>= 0), and the first step of `epoch` (>= 0), under a valid table.
int64_t epochOfStep(const std::vector<EpochSteps>& table, int64_t step);
int64_t firstStepOfEpoch(const std::vector<EpochSteps>& table, int64_t epoch);

// The steps of a run under a deal. All clusters present in an epoch take the same number of
// optimizer steps in it — the fewest whole batches any of their shards holds — so the clusters'
// step counts (and with them the ring syncs every local_steps steps) stay in line, and steps
// are numbered run-wide: a cluster formed at epoch E starts at firstStepOf(E), the step the
// clusters already training are at when E begins. Plain values; pure.
// Status: built and tested; not yet used by the trainers (BatchFeeder/RunPlan still use
// ShardSampler and RunPlan::forShard: docs/OPERATIONS.md "Growing").
class DealSchedule {
 public:
  // BadInput naming the epoch's entry and the cluster when some present cluster's shard holds
  // less than one batch (as RunPlan::forShard's message for the fixed deal).
  DealSchedule(const std::vector<int64_t>& chunk_sizes, std::vector<DealEntry> deal,
               const std::vector<int64_t>& chunk_ids, uint64_t seed, int64_t batch_size);
  // Steps every present cluster takes in `epoch` (epoch >= 0).
  int64_t stepsIn(int64_t epoch) const;
  // The run-wide number of the first step of `epoch`: the steps of the epochs before it.
  int64_t firstStepOf(int64_t epoch) const;
  // The epoch run-wide step `step` (>= 0) belongs to.
  int64_t epochOf(int64_t step) const;
  // Steps of the whole run: firstStepOf(epochs) when epochs > 0, else max_steps; capped by
  // max_steps when that is > 0 (TrainOptions' epochs and max_steps).
  int64_t totalSteps(int64_t epochs, int64_t max_steps) const;
  // One entry per deal entry: {from_epoch, steps in each of its epochs} (RunPlan::epoch_steps).
  const std::vector<EpochSteps>& table() const { return table_; }

 private:
  std::vector<EpochSteps> table_;
};

}  // namespace cairn
