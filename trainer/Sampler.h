// ShardSampler: which training samples this cluster sees, and in what order.
// The training set is a row of contiguous chunks: its shard files when it has several (each file a
// chunk), else `chunks` equal cuts (data.chunks; default one per cluster). data.chunk lists the
// chunk ids the job trains on (default: all). The listed chunks are dealt to clusters round robin
// (cluster c gets the i-th listed chunk when i % clusters == c), so clusters' shards are disjoint.
// Every epoch the shard is reshuffled with a generator seeded by (seed, cluster, epoch): the same
// job and seed give the same order on any machine.
// Thread-safety: immutable after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cairn {

class ShardSampler {
 public:
  // `chunks` equal cuts of `dataset_size` samples (chunks <= 0: one per cluster).
  ShardSampler(int64_t dataset_size, int cluster, int clusters, int64_t chunks,
               const std::vector<int64_t>& chunk_ids, uint64_t seed);
  // Chunk k holds the next chunk_sizes[k] samples (sample ids in order, chunk after chunk).
  ShardSampler(const std::vector<int64_t>& chunk_sizes, int cluster, int clusters,
               const std::vector<int64_t>& chunk_ids, uint64_t seed);
  // `chunks` (<= 0: `clusters`) near-equal cuts of `dataset_size`: the chunk_sizes of the first
  // constructor.
  static std::vector<int64_t> equalChunks(int64_t dataset_size, int64_t chunks, int clusters);
  const std::vector<int64_t>& shard() const { return shard_; }
  // The shard in this epoch's order.
  std::vector<int64_t> epochOrder(int64_t epoch) const;

 private:
  std::vector<int64_t> shard_;
  uint64_t seed_;
  int cluster_;
};

// A checksum of sample ids that does not depend on their order within a micro-batch but does on
// which ids they are (the Root and the Leaf both log it per step to prove targets stayed aligned).
uint64_t sampleIdChecksum(const int64_t* ids, size_t count);

}  // namespace cairn
