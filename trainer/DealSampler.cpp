#include "trainer/DealSampler.h"

#include <utility>

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

}  // namespace cairn
