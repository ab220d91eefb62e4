#include "trainer/data/ServedDataset.h"

#include <algorithm>

#include "core/Error.h"

namespace cairn {
namespace {

std::vector<int64_t> beginsOf(const std::vector<ServedShard>& table) {
  std::vector<int64_t> begins{0};
  for (const ServedShard& s : table) begins.push_back(begins.back() + s.samples);
  return begins;
}

// The chunk holding sample `id`.
size_t chunkOf(const std::vector<int64_t>& begins, int64_t id) {
  return size_t(std::upper_bound(begins.begin(), begins.end(), id) - begins.begin()) - 1;
}

}  // namespace

ServedDataset::ServedDataset(const DataOptions& options, std::vector<ServedShard> table,
                             ChunkSource& source, std::string key)
    : options_(options), table_(std::move(table)), begins_(beginsOf(table_)), source_(source),
      key_(std::move(key)) {
  if (options_.format != "tokens" && options_.format != "safetensors")
    CAIRN_THROW(BadInput, "job.json: data.format \"", options_.format,
                "\" cannot be served by the coordinator (only tokens and safetensors, whose shards "
                "are single files)");
  if (table_.empty()) CAIRN_THROW(BadInput, "job.json: ", key_, " is empty");
  for (size_t k = 0; k < table_.size(); ++k) {
    if (table_[k].chunk != table_.front().chunk + int64_t(k))
      CAIRN_THROW(BadInput, "job.json: ", key_, "[", k, "].chunk is ", table_[k].chunk, ", expected ",
                  table_.front().chunk + int64_t(k), " (consecutive chunk ids)");
    if (table_[k].samples <= 0)
      CAIRN_THROW(BadInput, "job.json: ", key_, "[", k, "].samples must be > 0");
  }
}

const Dataset& ServedDataset::chunk(size_t k) const {
  auto it = open_.find(k);
  if (it != open_.end()) return *it->second;
  DataOptions one = options_;
  one.location = source_.ready(table_[k].chunk);
  one.test_location.clear();
  one.test_fraction = 0;
  one.train_samples = table_[k].samples;
  one.test_samples = 0;
  one.chunks = 0;
  one.chunk.clear();
  DatasetPair pair = loadDatasets(one, 0);
  if (pair.train->size() != table_[k].samples)
    CAIRN_THROW(BadInput, "served data: chunk ", table_[k].chunk, " (", table_[k].file, ") holds ",
                pair.train->size(), " samples, the chunk table (", key_, ") says ", table_[k].samples);
  return *open_.emplace(k, std::move(pair.train)).first->second;
}

Batch ServedDataset::get(const std::vector<int64_t>& ids, bool training) const {
  // Gather each chunk's samples in one read, then put the batch back in the order of `ids`.
  std::map<size_t, std::vector<int64_t>> local;  // chunk → its samples' local ids
  std::map<size_t, std::vector<int64_t>> where;  // chunk → their positions in `ids`
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size())
      CAIRN_THROW(InternalError, "served data: sample ", ids[i], " outside [0, ", size(), ")");
    const size_t k = chunkOf(begins_, ids[i]);
    local[k].push_back(ids[i] - begins_[k]);
    where[k].push_back(int64_t(i));
  }
  std::vector<Batch> parts;
  std::vector<int64_t> positions;
  for (const auto& [k, chunk_ids] : local) {
    parts.push_back(chunk(k).get(chunk_ids, training));
    positions.insert(positions.end(), where[k].begin(), where[k].end());
  }
  // row r of the concatenation is sample positions[r]; invert to read them back in order.
  std::vector<int64_t> inverse(ids.size());
  for (size_t r = 0; r < positions.size(); ++r) inverse[size_t(positions[r])] = int64_t(r);
  const torch::Tensor order = torch::tensor(inverse, torch::kLong);
  auto gather = [&](auto field) {
    std::vector<torch::Tensor> pieces;
    for (const Batch& b : parts) pieces.push_back(field(b));
    return torch::cat(pieces).index_select(0, order);
  };
  Batch out;
  out.inputs = gather([](const Batch& b) { return b.inputs; });
  out.targets = gather([](const Batch& b) { return b.targets; });
  for (size_t e = 0; e < parts.front().extra_inputs.size(); ++e)
    out.extra_inputs.push_back(gather([e](const Batch& b) { return b.extra_inputs[e]; }));
  return out;
}

std::vector<ShardInfo> ServedDataset::shards() const {
  std::vector<ShardInfo> out;
  for (const ServedShard& s : table_) out.push_back({s.file, s.samples, s.bytes});
  return out;
}

int64_t ServedDataset::inputCount() const {
  return options_.format == "tokens" ? 1 : int64_t(options_.inputs.size());
}

std::vector<int64_t> firstNeedOrder(const std::vector<ServedShard>& table,
                                    const std::vector<int64_t>& ids) {
  const std::vector<int64_t> begins = beginsOf(table);
  std::vector<bool> seen(table.size(), false);
  std::vector<int64_t> out;
  for (int64_t id : ids) {
    if (id < 0 || id >= begins.back()) continue;
    const size_t k = chunkOf(begins, id);
    if (!seen[k]) {
      seen[k] = true;
      out.push_back(int64_t(k));
    }
  }
  return out;
}

}  // namespace cairn
