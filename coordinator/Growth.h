// Growth: the coordinator's pure decision whether the waiting spares can hold one more whole
// pipeline (issue [J] "Growing"; docs/OPERATIONS.md "Growing"). No store, no sockets, no clock.
//   chooseGrowth  which spare holds each stage of the new cluster, or nothing
//   grownDeal     the deal after one more cluster forms: from the epoch after the newest epoch
//                 any cluster has reported, one more cluster
//   loadDeal/saveDeal  the deal table kept in coordinator.db (meta key "deal", JSON
//                 [{"from_epoch":E,"clusters":n},…]; absent: one entry {0, planned clusters}),
//                 validated on load with errors naming deal[i].<field>
// Rule: a stage needs a spare whose probe reports at least `stage_ram_gb[s]` GB (the RAM the plan
// placed that stage on — the same rule as replacement), every stage a different spare, and after
// taking them at least `keep_spares` spares must still wait (spares meant to replace lost members
// are never consumed by growth). Stages are filled in order of decreasing need, each with the
// earliest-joined qualifying spare (members() order): any spare that can hold a stage can hold
// every stage needing less, so this finds a pipeline whenever one exists.
// Status: decision and its tests only; the coordinator does not call it yet (see the issue).
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "trainer/DealSampler.h"

namespace cairn::coordinator {

// The RAM (GB) a member's probe reports; 0 when it has none.
double probedRamGb(const Member& m);

// The spare for each stage (index = stage), or nullopt when the spares cannot hold a pipeline and
// still leave `keep_spares` waiting.
std::optional<std::vector<Member>> chooseGrowth(const std::vector<Member>& members,
                                                const std::vector<double>& stage_ram_gb,
                                                int keep_spares);

// `deal` plus an entry {E, last clusters + 1} with E = max(newest_reported_epoch + 1, 1, the
// last entry's from_epoch + 1): the epoch after the newest any cluster has reported (-1: none yet),
// never epoch 0 and never before an earlier change.
std::vector<DealEntry> grownDeal(const std::vector<DealEntry>& deal, int64_t newest_reported_epoch);

std::string dealJson(const std::vector<DealEntry>& deal);
// BadInput naming `where` and deal[i].<field> when the text is not a valid deal.
std::vector<DealEntry> parseDeal(const std::string& json, const std::string& where);
std::vector<DealEntry> loadDeal(const CoordinatorStore& store, int planned_clusters);
void saveDeal(CoordinatorStore& store, const std::vector<DealEntry>& deal);

}  // namespace cairn::coordinator
