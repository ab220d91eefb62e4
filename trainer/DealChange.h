// DealChange: a running cluster takes a new deal (issue [J] "Growing"; docs/TRAINING.md
// "Changing the number of clusters: the deal"). The coordinator grows the run by sending every
// node a node.json whose extra.deal has one more entry {from_epoch E, clusters n + 1}; the
// provider hands it to the trainer (StageTrainerConfig::offered_deal).
//   Root, between steps (atStep): an offered deal that differs from the current one is taken
//        when it agrees with the current deal on every epoch up to the current one (the new
//        entries start after it): the sampler, the epoch_steps table and total_steps follow it,
//        and ClusterSync::admitJoinersAt(firstStepOf(E)) is called for each new entry so the
//        rings take the new cluster in at exactly its first step. Otherwise (the Root is already
//        in epoch E or later: the deal came too late) it is refused, once per offered deal.
//        Both are logged and written to metrics.jsonl as {"deal": {"accepted", "deal", "epoch",
//        "step", "reason"}} (streamed to the coordinator, which re-deals from a later epoch
//        after a refusal).
//   Every node but the Leaf (attach): once the table changed in this run, every activation
//        carries "__epoch_steps" (int64: total_steps, then from_epoch, steps per table entry).
//   Every node but the Root (read): a "__epoch_steps" that differs from the plan is taken: the
//        plan's table and total_steps, and admitJoinersAt for each new table entry.
// A decision depends only on the step at which the Root first sees the offer, never on the
// clock, and every stage of the cluster learns it in the same step.
// Limits: the sync schedule only (AsyncLoop does not call it); an offer is not kept across a
// pause (the resumed trainer starts from the node.json the update wrote).
// Ownership: borrows the context, the plan it changes and the Root's feeder.
// Thread-safety: the trainer's thread (offered_deal is the caller's to make thread-safe).
// Header-only (inline functions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/BatchFeeder.h"
#include "trainer/ClusterSync.h"
#include "trainer/DealSampler.h"
#include "trainer/Metrics.h"
#include "trainer/ReservedTensors.h"
#include "trainer/RunPlan.h"
#include "trainer/StageLink.h"
#include "trainer/TrainerContext.h"

namespace cairn {

class DealChange {
 public:
  DealChange(TrainerContext& ctx, RunPlan& plan, BatchFeeder& feeder)
      : ctx_(ctx), plan_(plan), feeder_(feeder) {}

  // Root: before step `step` loads its batch. Returns true when a new deal was taken.
  bool atStep(int64_t step);
  void attach(StagePacket& activation) const;
  // BadInput when "__epoch_steps" is malformed or changes the steps before this packet's step.
  void read(const StagePacket& activation);

 private:
  // The table entries of `next` not in `before` (same from_epoch and steps): admitJoinersAt
  // firstStepOfEpoch(next, entry.from_epoch) for each, when it lies after `step`.
  void admitNewEntries(const std::vector<EpochSteps>& before, const std::vector<EpochSteps>& next,
                       int64_t step);

  TrainerContext& ctx_;
  RunPlan& plan_;
  BatchFeeder& feeder_;
  bool changed_ = false;        // the table changed during this run: activations carry it
  std::string last_offer_;      // the offer last decided (its JSON text)
};

// The deal entries in force at epochs 0..epoch (those with from_epoch <= epoch).
std::vector<DealEntry> dealUpTo(const std::vector<DealEntry>& deal, int64_t epoch);

// ---- implementation (inline) ----

namespace deal_change_detail {

inline nlohmann::json dealToJson(const std::vector<DealEntry>& deal) {
  nlohmann::json out = nlohmann::json::array();
  for (const DealEntry& e : deal) out.push_back({{"from_epoch", e.from_epoch}, {"clusters", e.clusters}});
  return out;
}

inline std::string tableText(const std::vector<EpochSteps>& table, int64_t total) {
  std::string out = "[";
  for (const EpochSteps& e : table)
    out += (out.size() > 1 ? "," : "") + std::string("[") + std::to_string(e.from_epoch) + "," +
           std::to_string(e.steps) + "]";
  return out + "], " + std::to_string(total) + " steps";
}

}  // namespace deal_change_detail

inline std::vector<DealEntry> dealUpTo(const std::vector<DealEntry>& deal, int64_t epoch) {
  std::vector<DealEntry> out;
  for (const DealEntry& e : deal)
    if (e.from_epoch <= epoch) out.push_back(e);
  return out;
}

inline void DealChange::admitNewEntries(const std::vector<EpochSteps>& before,
                                 const std::vector<EpochSteps>& next, int64_t step) {
  if (!ctx_.cfg.cluster_sync) return;
  for (const EpochSteps& e : next) {
    bool known = false;
    for (const EpochSteps& b : before) known = known || b == e;
    if (known || e.from_epoch == 0) continue;
    const int64_t first = firstStepOfEpoch(next, e.from_epoch);
    if (first > step) ctx_.cfg.cluster_sync->admitJoinersAt(first);
  }
}

inline bool DealChange::atStep(int64_t step) {
  if (!ctx_.is_root || !ctx_.cfg.offered_deal) return false;
  const std::optional<nlohmann::json> offer = ctx_.cfg.offered_deal();
  if (!offer) return false;
  const std::string text = offer->dump();
  if (text == last_offer_) return false;
  last_offer_ = text;
  const std::string& name = ctx_.cfg.node.name;
  const int64_t epoch = plan_.epochOf(step);
  auto report = [&](bool accepted, const std::string& reason) {
    ctx_.metrics.write({{"deal", {{"accepted", accepted}, {"deal", *offer}, {"epoch", epoch},
                                  {"step", step}, {"reason", reason}}}});
  };
  std::vector<DealEntry> next;
  try {
    next = dealFromJson(*offer, "the deal a peers update gave " + name);
  } catch (const BadInput& e) {
    CAIRN_WARN("refused a new deal: ", e.what());
    report(false, e.what());
    return false;
  }
  const std::vector<DealEntry>& current = feeder_.deal();
  if (next == current) return false;
  if (dealUpTo(next, epoch) != dealUpTo(current, epoch)) {
    const std::string why = "the cluster is already in epoch " + std::to_string(epoch) +
                            " (step " + std::to_string(step) + ") and the new deal " +
                            deal_change_detail::dealToJson(next).dump() + " changes it or an epoch before it";
    CAIRN_WARN("refused a new deal: ", why, "; the coordinator deals again from a later epoch");
    report(false, why);
    return false;
  }
  const std::vector<EpochSteps> before = plan_.epoch_steps;
  RunPlan changed = plan_;
  try {
    feeder_.changeDeal(next, &changed);
  } catch (const BadInput& e) {
    CAIRN_WARN("refused a new deal: ", e.what());
    report(false, e.what());
    return false;
  }
  plan_ = changed;
  changed_ = true;
  CAIRN_INFO("data: took the new deal ", deal_change_detail::dealToJson(next).dump(), " at step ", step, " (epoch ",
             epoch, "): epoch steps ", deal_change_detail::tableText(plan_.epoch_steps, plan_.total_steps));
  report(true, "");
  admitNewEntries(before, plan_.epoch_steps, step);
  if (ctx_.observer.on_plan) ctx_.observer.on_plan(plan_.total_steps, plan_.steps_per_epoch);
  return true;
}

inline void DealChange::attach(StagePacket& activation) const {
  if (!changed_) return;
  std::vector<int64_t> values{plan_.total_steps};
  for (const EpochSteps& e : plan_.epoch_steps) {
    values.push_back(e.from_epoch);
    values.push_back(e.steps);
  }
  activation.tensors.emplace_back(kEpochStepsTensor, torch::tensor(values, torch::kLong));
}

inline void DealChange::read(const StagePacket& in) {
  if (!in.has(kEpochStepsTensor)) return;
  const torch::Tensor& t = in.tensor(kEpochStepsTensor);
  auto bad = [&](const std::string& what) {
    CAIRN_THROW(BadInput, "activation from upstream for step ", in.step, " micro-batch ",
                in.microbatch, ": ", kEpochStepsTensor, " ", what);
  };
  if (t.scalar_type() != torch::kLong || t.dim() != 1 || t.numel() < 3 || t.numel() % 2 != 1)
    bad("must be a 1-d int64 tensor [total_steps, from_epoch, steps, …]");
  const torch::Tensor c = t.contiguous();
  const int64_t* v = c.data_ptr<int64_t>();
  std::vector<EpochSteps> table;
  for (int64_t i = 1; i < c.numel(); i += 2) table.push_back({v[i], v[i + 1]});
  const int64_t total = v[0];
  if (table == plan_.epoch_steps && total == plan_.total_steps) return;
  validateEpochSteps(table, std::string(kEpochStepsTensor));
  const int64_t step = int64_t(in.step);
  RunPlan next = plan_;
  next.epoch_steps = table;
  next.steps_per_epoch = table.front().steps;
  next.total_steps = total;
  // The steps already taken must keep their numbering: the same epoch boundaries up to the
  // packet's step, and the run not ended before it.
  if (total <= step) bad("ends the run at " + std::to_string(total) + ", before step " + std::to_string(step));
  const int64_t epoch = plan_.epochOf(step);
  if (next.epochOf(step) != epoch || next.firstStepOf(epoch) != plan_.firstStepOf(epoch))
    bad("renumbers the steps before step " + std::to_string(step));
  const std::vector<EpochSteps> before = plan_.epoch_steps;
  plan_ = next;
  changed_ = true;
  CAIRN_INFO("data: the Root took a new deal at step ", step, ": epoch steps ",
             deal_change_detail::tableText(plan_.epoch_steps, plan_.total_steps));
  admitNewEntries(before, plan_.epoch_steps, step);
  if (ctx_.observer.on_plan) ctx_.observer.on_plan(plan_.total_steps, plan_.steps_per_epoch);
}

}  // namespace cairn
