// ServedDataset: the training (or test) set of a Root whose data the coordinator serves (issue [K] part 2):
// the shards live on the coordinator's machine; this Root has only the chunk table (each chunk's
// file name, size, sample count and CRC-32) and, on demand, the verified files of its own
// cluster's chunks from a ChunkSource (node/volunteer/ChunkFetcher.h behind this trainer-side interface).
// Sample ids are those of the same shards read locally (chunk after chunk, table order), so the
// sampler's order — and the run — is the same as with local files. A chunk's file is opened on
// its first read (after ChunkSource::ready) as a one-shard dataset of the table's format and
// options, and must hold exactly the table's sample count.
// Only formats whose shard is one file are served: tokens and safetensors.
// Ownership: borrows the ChunkSource (it must outlive the dataset); owns the opened chunks.
// Thread-safety: the Root's trainer thread only (as every Dataset).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/Dataset.h"

namespace cairn {

// ServedShard (a row of the chunk table) is in trainer/TrainOptions.h, with data.shards.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Starts fetching `order` (this cluster's chunks, in the order they are first needed) into a
  // cache of at most `cache_bytes`; called once, before any ready().
  virtual void start(const std::vector<ServedShard>& order, uint64_t cache_bytes) = 0;
  // Fetches `more` too, after the chunks given so far (a running Root that took a grown deal,
  // trainer/DealChange.h: the chunks the new deal gives this cluster that it did not have);
  // after start(), before any ready() of them. BadInput naming a chunk the cache cannot hold.
  virtual void add(const std::vector<ServedShard>& more) = 0;
  // The local path of `chunk`'s verified file, once it is there; BadInput naming the chunk when it
  // cannot be had.
  virtual std::string ready(int64_t chunk) = 0;
};

class ServedDataset : public Dataset {
 public:
  // `options`: the job's data options (format, inputs/targets, block_length, token_dtype).
  // `table`: data.shards (the training set) or data.test_shards (the test set, its chunk ids
  // following the training chunks'); ids must be consecutive from the first row's; `key` names
  // the table in errors. BadInput when the format is not served or the table is empty or
  // inconsistent.
  ServedDataset(const DataOptions& options, std::vector<ServedShard> table, ChunkSource& source,
                std::string key = "data.shards");
  int64_t size() const override { return begins_.back(); }
  Batch get(const std::vector<int64_t>& ids, bool training) const override;
  std::vector<ShardInfo> shards() const override;
  int64_t inputCount() const override;

 private:
  const Dataset& chunk(size_t k) const;

  DataOptions options_;
  std::vector<ServedShard> table_;
  std::vector<int64_t> begins_;  // first sample id of each chunk, then size()
  ChunkSource& source_;
  std::string key_;
  mutable std::map<size_t, std::unique_ptr<Dataset>> open_;
};

// The chunks of `table` in the order `ids` first touch them (each once): the order a Root's
// fetcher should fetch them in for a sampler order `ids`.
std::vector<int64_t> firstNeedOrder(const std::vector<ServedShard>& table,
                                    const std::vector<int64_t>& ids);

}  // namespace cairn
