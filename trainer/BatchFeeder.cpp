#include "trainer/BatchFeeder.h"

#include <algorithm>
#include <set>
#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/Loss.h"
#include "trainer/data/ServedDataset.h"

namespace cairn {

RunPlan BatchFeeder::open() {
  const TrainOptions& opt = ctx_.opt;
  const StageTrainerConfig& cfg = ctx_.cfg;
  const bool served = cfg.data.source == "coordinator";
  if (served) {
    openServed();
  } else {
    data_ = loadDatasets(cfg.data, opt.seed);
  }
  const int64_t inputs = data_.train->inputCount(), stage_inputs = int64_t(cfg.node.inputs.size());
  if (inputs != stage_inputs)
    CAIRN_THROW(BadInput, "job.json: data gives the model ", inputs, " input(s)",
                inputs > 1 || cfg.data.format == "safetensors" || cfg.data.format == "npy"
                    ? " (data.inputs)"
                    : "",
                " but the Root stage ", cfg.node.name, " takes ", stage_inputs,
                " (node.json inputs)");
  // A deal in node.json (extra.deal: a run whose number of clusters changes, docs/TRAINING.md
  // "the deal"); without one, the planned clusters from epoch 0 on, which is exactly
  // ShardSampler's deal.
  std::vector<DealEntry> deal = {{0, cfg.num_clusters}};
  const bool dealt = cfg.node.extra.is_object() && cfg.node.extra.contains("deal");
  int64_t first_epoch = 0;  // the epoch this cluster first trains in
  if (dealt) {
    deal = dealFromJson(cfg.node.extra["deal"], "node.json of " + cfg.node.name + ": extra.deal");
    first_epoch =
        checkDealForCluster(deal, cfg.node.cluster, "node.json of " + cfg.node.name + ": extra.deal");
  }
  chunk_sizes_ = chunkSizes(*data_.train, cfg.data, cfg.num_clusters);
  const std::vector<int64_t>& chunk_sizes = chunk_sizes_;
  sampler_ = std::make_unique<DealSampler>(chunk_sizes, cfg.node.cluster, deal, cfg.data.chunk,
                                           opt.seed);
  if (served) startFetching(first_epoch);
  const int64_t shard = int64_t(sampler_->shard(first_epoch).size());
  const int64_t test = data_.test ? data_.test->size() : 0;
  RunPlan plan = RunPlan::forShard(opt, shard, test);
  if (dealt) {
    const DealSchedule schedule(chunk_sizes, deal, cfg.data.chunk, opt.seed, opt.batch_size);
    plan.epoch_steps = schedule.table();
    plan.steps_per_epoch = plan.epoch_steps.front().steps;
    plan.total_steps = schedule.totalSteps(opt.epochs, opt.max_steps);
    plan.first_step = std::min(schedule.firstStepOf(first_epoch), plan.total_steps);
    if (plan.first_step > 0)
      CAIRN_INFO("data: this cluster is added by the deal from epoch ", first_epoch,
                 ": it starts at step ", plan.first_step, " with its ring peers' weights");
  }
  CAIRN_INFO("data: ", data_.train->size(), " training samples in ", data_.train->shards().size(),
             " file(s) (this cluster's shard: ", shard, "), ", test, " test samples; ",
             plan.total_steps, " steps of ", opt.batch_size, " samples in ", opt.microbatches,
             " micro-batches");
  if (opt.record_sample_ids && !cfg.sample_ids_path.empty()) {
    sample_ids_out_.open(cfg.sample_ids_path,
                         cfg.resume_step >= 0 ? std::ios::app : std::ios::trunc);
    if (!sample_ids_out_) CAIRN_THROW(BadInput, cfg.sample_ids_path, ": cannot write");
  }
  return plan;
}

void BatchFeeder::changeDeal(const std::vector<DealEntry>& deal, RunPlan* plan, bool dry_run) {
  const TrainOptions& opt = ctx_.opt;
  const StageTrainerConfig& cfg = ctx_.cfg;
  const std::string where = "the deal a peers update gave " + cfg.node.name;
  const int64_t first_epoch = checkDealForCluster(deal, cfg.node.cluster, where);
  const DealSchedule schedule(chunk_sizes_, deal, cfg.data.chunk, opt.seed, opt.batch_size);
  auto sampler = std::make_unique<DealSampler>(chunk_sizes_, cfg.node.cluster, deal, cfg.data.chunk,
                                               opt.seed);
  if (cfg.data.source == "coordinator") {
    // Served data: the chunks the new deal gives this cluster that it was not fetching (a chunk
    // dealt round robin over one more cluster may go to another cluster than before) are fetched
    // after the others; the coordinator serves them from the moment it proposed the deal.
    std::vector<ServedShard> more;
    std::vector<int64_t> rows;
    uint64_t bytes = fetch_bytes_;
    for (int64_t k : dealtChunks(*sampler, first_epoch)) {
      if (fetching_.count(k)) continue;
      rows.push_back(k);
      more.push_back(cfg.data.shards[size_t(k)]);
      bytes += more.back().bytes;
    }
    const uint64_t cache = uint64_t(cfg.data.cache_mb) << 20;
    if (bytes > cache)
      CAIRN_THROW(BadInput, where, ": with it cluster ", cfg.node.cluster, " would fetch ", more.size(),
                  " more chunks, ", bytes, " bytes in all with the test chunks, but data.cache_mb is ",
                  cfg.data.cache_mb, " MiB (job.json): raise data.cache_mb");
    if (!more.empty() && !dry_run) {
      cfg.chunk_source->add(more);
      fetching_.insert(rows.begin(), rows.end());
      fetch_bytes_ = bytes;
      CAIRN_INFO("data: the new deal gives this cluster ", more.size(), " more chunk(s) (",
                 bytes, " bytes in the cache in all); fetching them from the coordinator");
    }
  }
  if (!dry_run) {
    sampler_ = std::move(sampler);
    epoch_of_order_ = -1;  // the current epoch's order is the same; recomputed on the next load
  }
  plan->epoch_steps = schedule.table();
  plan->steps_per_epoch = plan->epoch_steps.front().steps;
  plan->total_steps = schedule.totalSteps(opt.epochs, opt.max_steps);
}

void BatchFeeder::openServed() {
  const StageTrainerConfig& cfg = ctx_.cfg;
  if (cfg.data.shards.empty())
    CAIRN_THROW(BadInput, "job.json: data.source is \"coordinator\" but data.shards (the chunk "
                          "table) is missing: such a job is run by volunteers of clusterize --serve, "
                          "which writes it");
  if (!cfg.chunk_source)
    CAIRN_THROW(BadInput, "job.json: data.source is \"coordinator\": the chunks come from the "
                          "coordinator, so this node must be a volunteer (provider --join)");
  data_.train = std::make_unique<ServedDataset>(cfg.data, cfg.data.shards, *cfg.chunk_source);
  // The test set (data.test_location on the coordinator's machine) is not dealt: every cluster's
  // Root evaluates on all of it, as with local files.
  data_.test = nullptr;
  if (!cfg.data.test_location.empty()) {
    if (cfg.data.test_shards.empty())
      CAIRN_THROW(BadInput, "job.json: data.test_location is set with data.source \"coordinator\" "
                            "but data.test_shards (the test chunk table) is missing: the coordinator "
                            "of clusterize --serve writes it when it plans");
    data_.test = std::make_unique<ServedDataset>(cfg.data, cfg.data.test_shards, *cfg.chunk_source,
                                                 "data.test_shards");
  }
}

std::vector<int64_t> BatchFeeder::dealtChunks(const DealSampler& sampler, int64_t first_epoch) const {
  // The shard is the same set in every epoch of one deal entry (only its order changes), so the
  // first epoch of each entry from `first_epoch` on names them all.
  std::vector<int64_t> epochs{first_epoch};
  for (const DealEntry& e : sampler.deal())
    if (e.from_epoch > first_epoch) epochs.push_back(e.from_epoch);
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t epoch : epochs)
    for (int64_t k : firstNeedOrder(ctx_.cfg.data.shards, sampler.epochOrder(epoch)))
      if (seen.insert(k).second) out.push_back(k);
  return out;
}

void BatchFeeder::startFetching(int64_t first_epoch) {
  // The random sampler draws from every chunk of the shard throughout an epoch (the first batch
  // already touches most of them), so a chunk released within an epoch would be fetched again
  // at once: the cache must hold the cluster's chunks, all fetched ahead, in the order its first
  // epoch needs them — with a deal (docs/TRAINING.md "the deal") every chunk it deals this
  // cluster in any epoch from its first, each entry's after the one before. Then every test
  // chunk (every evaluation reads the whole test set), which the cache holds too.
  const StageTrainerConfig& cfg = ctx_.cfg;
  std::vector<ServedShard> order;
  uint64_t bytes = 0;
  for (int64_t k : dealtChunks(*sampler_, first_epoch)) {
    order.push_back(cfg.data.shards[size_t(k)]);
    bytes += order.back().bytes;
    fetching_.insert(k);
  }
  const size_t training = order.size();
  if (data_.test) {
    for (const ServedShard& s : cfg.data.test_shards) {
      order.push_back(s);
      bytes += s.bytes;
    }
  }
  const std::string test_chunks =
      data_.test ? " and the " + std::to_string(order.size() - training) + " test chunks" : "";
  const uint64_t cache = uint64_t(cfg.data.cache_mb) << 20;
  if (bytes > cache)
    CAIRN_THROW(BadInput, "job.json: data.cache_mb is ", cfg.data.cache_mb, " MiB but cluster ",
                cfg.node.cluster, "'s ", training, " chunks", test_chunks, " hold ", bytes, " bytes (",
                (bytes + (1 << 20) - 1) >> 20, " MiB); every epoch reads all of them",
                data_.test ? " and every evaluation all the test chunks" : "",
                ", so the cache must hold them: raise data.cache_mb or use more clusters");
  CAIRN_INFO("data: fetching this cluster's ", training, " chunks", test_chunks, " (", bytes,
             " bytes) from the coordinator ahead of need");
  cfg.chunk_source->start(order, cache);
  fetch_bytes_ = bytes;
}

uint64_t BatchFeeder::load(int64_t step, std::map<int, Microbatch>* micro) {
  const TrainOptions& opt = ctx_.opt;
  const int64_t epoch = ctx_.plan.epochOf(step);
  const int64_t position = ctx_.plan.positionOf(step);
  if (epoch_of_order_ != epoch) {
    epoch_of_order_ = epoch;
    epoch_order_ = sampler_->epochOrder(epoch_of_order_);
  }
  std::vector<int64_t> ids(epoch_order_.begin() + position * opt.batch_size,
                           epoch_order_.begin() + (position + 1) * opt.batch_size);
  if (ctx_.observer.on_batch) ctx_.observer.on_batch(step, ids);
  if (sample_ids_out_.is_open())
    sample_ids_out_ << nlohmann::json{{"step", step}, {"ids", ids}}.dump() << '\n' << std::flush;
  const uint64_t checksum = sampleIdChecksum(ids.data(), ids.size());
  Batch batch = data_.train->get(ids, /*training=*/true);
  const int64_t terms = lossTermCount(opt.loss, batch.targets);
  torch::Tensor denominator = scalar64(double(std::max<int64_t>(terms, 1)));
  torch::Tensor id_tensor = torch::tensor(ids, torch::kLong);
  const int64_t m = opt.microbatches, base = opt.batch_size / m, extra = opt.batch_size % m;
  int64_t offset = 0;
  for (int64_t k = 0; k < m; ++k) {
    const int64_t size = base + (k < extra ? 1 : 0);
    Microbatch& mb = (*micro)[int(k)];
    mb.inputs.clear();
    for (const torch::Tensor& input : batch.modelInputs())
      mb.inputs.push_back(input.narrow(0, offset, size));
    mb.targets = batch.targets.narrow(0, offset, size);
    mb.ids = id_tensor.narrow(0, offset, size);
    mb.denominator = denominator;
    offset += size;
  }
  return checksum;
}

}  // namespace cairn
