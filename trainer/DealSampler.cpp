#include "trainer/DealSampler.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/Error.h"

namespace cairn {

void validateDeal(const std::vector<DealEntry>& deal, const std::string& where) {
  if (deal.empty()) CAIRN_THROW(BadInput, where, ": the deal needs at least one entry");
  for (size_t i = 0; i < deal.size(); ++i) {
    if (deal[i].clusters < 1)
      CAIRN_THROW(BadInput, where, "[", i, "].clusters is ", deal[i].clusters,
                  ": it must be at least 1");
    if (i == 0 && deal[i].from_epoch != 0)
      CAIRN_THROW(BadInput, where, "[0].from_epoch is ", deal[i].from_epoch,
                  ": the first entry must start at epoch 0");
    if (i > 0 && deal[i].from_epoch <= deal[i - 1].from_epoch)
      CAIRN_THROW(BadInput, where, "[", i, "].from_epoch is ", deal[i].from_epoch,
                  ": entries must start at strictly increasing epochs (the one before starts at ",
                  deal[i - 1].from_epoch, ")");
  }
}

std::vector<DealEntry> dealFromJson(const nlohmann::json& json, const std::string& where) {
  if (!json.is_array()) CAIRN_THROW(BadInput, where, " is not a JSON array of deal entries");
  std::vector<DealEntry> deal;
  for (size_t i = 0; i < json.size(); ++i) {
    const nlohmann::json& e = json[i];
    for (const char* key : {"from_epoch", "clusters"})
      if (!e.is_object() || !e.contains(key) || !e[key].is_number_integer())
        CAIRN_THROW(BadInput, where, "[", i, "].", key, " is missing or not an integer");
    const int64_t clusters = e["clusters"].get<int64_t>();
    if (clusters < 1 || clusters > 1000000)
      CAIRN_THROW(BadInput, where, "[", i, "].clusters is ", clusters,
                  ": it must be between 1 and 1000000");
    deal.push_back({e["from_epoch"].get<int64_t>(), int(clusters)});
  }
  validateDeal(deal, where);
  return deal;
}

nlohmann::json dealToJson(const std::vector<DealEntry>& deal) {
  nlohmann::json out = nlohmann::json::array();
  for (const DealEntry& e : deal) out.push_back({{"from_epoch", e.from_epoch}, {"clusters", e.clusters}});
  return out;
}

void putDealInForce(nlohmann::json& extra, const nlohmann::json& deal) {
  if (!extra.is_object()) extra = nlohmann::json::object();
  extra["deal"] = deal;
  extra.erase("offered_deal");
}

std::vector<DealEntry> dealUpTo(const std::vector<DealEntry>& deal, int64_t epoch) {
  std::vector<DealEntry> out;
  for (const DealEntry& e : deal)
    if (e.from_epoch <= epoch) out.push_back(e);
  return out;
}

int64_t checkDealForCluster(const std::vector<DealEntry>& deal, int cluster,
                            const std::string& where) {
  validateDeal(deal, where);
  for (size_t i = 1; i < deal.size(); ++i)
    if (deal[i].clusters < deal[i - 1].clusters)
      CAIRN_THROW(BadInput, where, "[", i, "].clusters is ", deal[i].clusters, ", fewer than the ",
                  deal[i - 1].clusters, " before it: clusters are only ever added");
  for (const DealEntry& e : deal)
    if (cluster < e.clusters) return e.from_epoch;
  CAIRN_THROW(BadInput, where, " never has more than ", deal.back().clusters,
              " cluster(s) but this node is of cluster ", cluster);
}

DealSampler::DealSampler(const std::vector<int64_t>& chunk_sizes, int cluster,
                         std::vector<DealEntry> deal, const std::vector<int64_t>& chunk_ids,
                         uint64_t seed)
    : deal_(std::move(deal)) {
  validateDeal(deal_, "deal");
  CAIRN_ENFORCE(cluster >= 0);
  // Placeholder sampler for entries in which this cluster does not exist (never read).
  for (const DealEntry& e : deal_) {
    const bool present = cluster < e.clusters;
    present_.push_back(present);
    samplers_.emplace_back(chunk_sizes, present ? cluster : 0, e.clusters, chunk_ids, seed);
  }
}

size_t DealSampler::entryIndex(int64_t epoch) const {
  CAIRN_ENFORCE(epoch >= 0);
  size_t i = 0;
  while (i + 1 < deal_.size() && deal_[i + 1].from_epoch <= epoch) ++i;
  return i;
}

const DealEntry& DealSampler::entryAt(int64_t epoch) const { return deal_[entryIndex(epoch)]; }

const std::vector<int64_t>& DealSampler::shard(int64_t epoch) const {
  static const std::vector<int64_t> kNone;
  const size_t i = entryIndex(epoch);
  return present_[i] ? samplers_[i].shard() : kNone;
}

std::vector<int64_t> DealSampler::epochOrder(int64_t epoch) const {
  const size_t i = entryIndex(epoch);
  if (!present_[i]) return {};
  return samplers_[i].epochOrder(epoch);
}

void validateEpochSteps(const std::vector<EpochSteps>& table, const std::string& where) {
  if (table.empty()) CAIRN_THROW(BadInput, where, ": the table needs at least one entry");
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].steps < 1)
      CAIRN_THROW(BadInput, where, "[", i, "].steps is ", table[i].steps, ": it must be at least 1");
    if (i == 0 && table[i].from_epoch != 0)
      CAIRN_THROW(BadInput, where, "[0].from_epoch is ", table[i].from_epoch,
                  ": the first entry must start at epoch 0");
    if (i > 0 && table[i].from_epoch <= table[i - 1].from_epoch)
      CAIRN_THROW(BadInput, where, "[", i, "].from_epoch is ", table[i].from_epoch,
                  ": entries must start at strictly increasing epochs");
  }
}

int64_t epochOfStep(const std::vector<EpochSteps>& table, int64_t step) {
  CAIRN_ENFORCE(step >= 0 && !table.empty());
  int64_t first = 0;  // first step of entry i
  for (size_t i = 0; i + 1 < table.size(); ++i) {
    const int64_t span = (table[i + 1].from_epoch - table[i].from_epoch) * table[i].steps;
    if (step < first + span) return table[i].from_epoch + (step - first) / table[i].steps;
    first += span;
  }
  return table.back().from_epoch + (step - first) / table.back().steps;
}

int64_t firstStepOfEpoch(const std::vector<EpochSteps>& table, int64_t epoch) {
  CAIRN_ENFORCE(epoch >= 0 && !table.empty());
  int64_t step = 0;
  for (size_t i = 0; i < table.size() && table[i].from_epoch < epoch; ++i) {
    const int64_t end = i + 1 < table.size() ? std::min(table[i + 1].from_epoch, epoch) : epoch;
    step += (end - table[i].from_epoch) * table[i].steps;
  }
  return step;
}

DealSchedule::DealSchedule(const std::vector<int64_t>& chunk_sizes, std::vector<DealEntry> deal,
                           const std::vector<int64_t>& chunk_ids, uint64_t seed, int64_t batch_size) {
  validateDeal(deal, "deal");
  if (batch_size < 1) CAIRN_THROW(BadInput, "deal schedule: batch size ", batch_size, " < 1");
  for (size_t i = 0; i < deal.size(); ++i) {
    int64_t fewest = -1;
    for (int c = 0; c < deal[i].clusters; ++c) {
      const ShardSampler sampler(chunk_sizes, c, deal[i].clusters, chunk_ids, seed);
      const int64_t shard = int64_t(sampler.shard().size());
      if (shard < batch_size)
        CAIRN_THROW(BadInput, "deal[", i, "] (from epoch ", deal[i].from_epoch, ", ",
                    deal[i].clusters, " clusters): cluster ", c, "'s shard holds ", shard,
                    " samples, less than one batch of ", batch_size,
                    " (training_definition.batch_size): list more data chunks (data.chunks)");
      const int64_t steps = shard / batch_size;
      fewest = fewest < 0 ? steps : std::min(fewest, steps);
    }
    table_.push_back({deal[i].from_epoch, fewest});
  }
}

int64_t DealSchedule::stepsIn(int64_t epoch) const {
  CAIRN_ENFORCE(epoch >= 0);
  size_t i = 0;
  while (i + 1 < table_.size() && table_[i + 1].from_epoch <= epoch) ++i;
  return table_[i].steps;
}

int64_t DealSchedule::firstStepOf(int64_t epoch) const { return firstStepOfEpoch(table_, epoch); }

int64_t DealSchedule::epochOf(int64_t step) const { return epochOfStep(table_, step); }

int64_t DealSchedule::totalSteps(int64_t epochs, int64_t max_steps) const {
  const int64_t total = epochs > 0 ? firstStepOf(epochs) : max_steps;
  return max_steps > 0 ? std::min(total, max_steps) : total;
}

}  // namespace cairn
