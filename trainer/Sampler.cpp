#include "trainer/Sampler.h"

#include <random>
#include <string>

#include "core/Error.h"

namespace cairn {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<int64_t> ShardSampler::equalChunks(int64_t dataset_size, int64_t chunks, int clusters) {
  if (chunks <= 0) chunks = clusters;
  std::vector<int64_t> sizes;
  for (int64_t c = 0; c < chunks; ++c)
    sizes.push_back(dataset_size * (c + 1) / chunks - dataset_size * c / chunks);
  return sizes;
}

ShardSampler::ShardSampler(int64_t dataset_size, int cluster, int clusters, int64_t chunks,
                           const std::vector<int64_t>& chunk_ids, uint64_t seed)
    : ShardSampler(equalChunks(dataset_size, chunks, clusters), cluster, clusters, chunk_ids,
                   seed) {}

ShardSampler::ShardSampler(const std::vector<int64_t>& chunk_sizes, int cluster, int clusters,
                           const std::vector<int64_t>& chunk_ids, uint64_t seed)
    : seed_(seed), cluster_(cluster) {
  CAIRN_ENFORCE(clusters >= 1 && cluster >= 0 && cluster < clusters);
  const int64_t chunks = int64_t(chunk_sizes.size());
  std::vector<int64_t> begins(chunk_sizes.size() + 1, 0);
  for (size_t k = 0; k < chunk_sizes.size(); ++k) begins[k + 1] = begins[k] + chunk_sizes[k];
  std::vector<int64_t> listed = chunk_ids;
  if (listed.empty())
    for (int64_t c = 0; c < chunks; ++c) listed.push_back(c);
  if (int64_t(listed.size()) < clusters)
    CAIRN_THROW(BadInput, "job.json: data.chunk lists ", listed.size(), " chunk(s) for ", clusters,
                " clusters: every cluster needs at least one");
  for (size_t i = 0; i < listed.size(); ++i) {
    if (int64_t(i % clusters) != cluster) continue;
    const int64_t c = listed[i];
    if (c < 0 || c >= chunks)
      CAIRN_THROW(BadInput, "job.json: data.chunk lists chunk ", c, " but there are ", chunks);
    for (int64_t id = begins[size_t(c)]; id < begins[size_t(c) + 1]; ++id) shard_.push_back(id);
  }
}

std::vector<int64_t> ShardSampler::epochOrder(int64_t epoch) const {
  std::vector<int64_t> order = shard_;
  // Fisher-Yates with mt19937_64 (fully specified by the standard, unlike std::shuffle).
  std::mt19937_64 rng(
      splitmix64(seed_ ^ splitmix64(uint64_t(cluster_) * 1000003u + uint64_t(epoch))));
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng() % i);
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

uint64_t sampleIdChecksum(const int64_t* ids, size_t count) {
  uint64_t sum = 0;
  for (size_t i = 0; i < count; ++i) sum += splitmix64(uint64_t(ids[i]));
  return sum;
}

}  // namespace cairn
