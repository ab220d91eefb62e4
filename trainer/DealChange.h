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
//   Roots of several running clusters (ClusterSync::agreesOnDeals: the Root shares a ring with
//        other clusters) decide together: before each step a Root proposes the newest offer it
//        holds (fingerprint: FNV-1a of its JSON text, in [2, 2^62); kNoOffer while it holds none,
//        which agrees with no offer) and its own verdict on it (the
//        feeder's dry run: its shard, its data cache); an offer is decided only at the step after
//        a sync at which every proposing Root held that same offer, and refused by all when any
//        of them could not take it. Every Root reaches that sync at the same ordinal of its
//        syncs, but not always at the same step: a cluster that resumed from a checkpoint lags
//        the others by whole syncs. So the deal is judged at the leading cluster's step (the
//        sync's DealAgreement::leading_steps_done: refused by all when the leading cluster is
//        already in epoch E), and each Root arms the admission at firstStepOf(E) less its own
//        lag behind the leading cluster: the same ordinal of its syncs for every cluster (the
//        leading one admits at exactly firstStepOf(E)). Whatever moment its update came, every
//        Root takes or refuses the same offer at the same sync.
//        A lone Root (one cluster, or rings of this node alone) decides as soon as it sees it.
//   Every node but the Leaf (attach): once the table changed in this run, every activation
//        carries "__epoch_steps" (int64: total_steps, then from_epoch, steps per table entry).
//   Every node but the Root (read): a "__epoch_steps" that differs from the plan is taken: the
//        plan's table and total_steps. The admission the Root armed reaches them from its
//        ClusterSync ("__admit" with growth, ClusterSync::gateAdmissions), not from the table:
//        only the Root knows its lag.
// A decision depends only on the step at which the Root first sees the offer (alone) or at
// which the Roots agreed on it (together), never on the clock, and every stage of the cluster
// learns it in the same step.
//   A Root that missed the sync where the others took the offer (paused, resuming) proposes it
//        too and learns at its own agreement that some proposer had taken it
//        (DealAgreement::taken_before): it follows them when its own epoch allows. (A Root that
//        took it and ran its stage again is offered its deal in force from the start, so it
//        proposes it as taken: node/pipeline/ProviderRun.h startingOffer.)
// Limits: the sync schedule only (AsyncLoop does not call it); a cluster that resumes after the
// others took an offer, already past its epoch, refuses it alone; clusters cut
// differently agree only ring by ring (a Root that shares no ring with another cluster's Root
// decides with the members of its own rings).
// Ownership: borrows the context, the plan it changes and the Root's feeder.
// Thread-safety: the trainer's thread (offered_deal is the caller's to make thread-safe).
// Header-only (inline functions).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Fnv.h"
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
  // firstStepOfEpoch(next, entry.from_epoch) - `lag` for each, when it lies after `step`.
  void admitNewEntries(const std::vector<EpochSteps>& before, const std::vector<EpochSteps>& next,
                       int64_t step, int64_t lag);

  // Takes or refuses `offer` (text: its dump) at `step`, once per offer. `all_can_take` false:
  // refused (`own_refusal` says why when this Root's own check refused it). The epoch is judged at
  // step `judged_at` (the leading cluster's when deciding together, this Root's own when another
  // Root had already taken the offer, or alone); `leading`: the most steps done of any cluster
  // deciding together (this cluster's lag is leading - step), `step` alone.
  bool decide(const nlohmann::json& offer, const std::string& text, bool all_can_take,
              const std::string& own_refusal, int64_t step, int64_t judged_at, int64_t leading);
  // This Root's own verdict on `offer`: "" when it could take it, else why not (the feeder's
  // dry run; the epoch is judged when deciding).
  std::string ownVerdict(const nlohmann::json& offer);
  // Whether `offer` is the deal this Root samples with (taken, or adopted from its checkpoint).
  bool inForce(const nlohmann::json& offer) const;

  TrainerContext& ctx_;
  RunPlan& plan_;
  BatchFeeder& feeder_;
  bool changed_ = false;        // the table changed during this run: activations carry it
  std::string last_offer_;      // the offer last decided (its JSON text)
  // Deciding together: the offer proposed at the syncs (its JSON, text, fingerprint, verdict).
  nlohmann::json proposed_;
  std::string proposed_text_;
  uint64_t proposed_fingerprint_ = 0;
  std::string proposed_refusal_;
  bool proposed_taken_ = false;  // the proposed offer is the deal in force here (taken or adopted)
};

// The fingerprint of an offer's JSON text a Root proposes to its ring peers: FNV-1a (64-bit),
// kept in [2, 2^62). 0 abstains (a node that is no Root), kNoOffer is a Root holding no offer yet.
uint64_t offerFingerprint(const std::string& text);
constexpr uint64_t kNoOffer = 1;

// ---- implementation (inline) ----

namespace deal_change_detail {

inline std::string tableText(const std::vector<EpochSteps>& table, int64_t total) {
  std::string out = "[";
  for (const EpochSteps& e : table)
    out += (out.size() > 1 ? "," : "") + std::string("[") + std::to_string(e.from_epoch) + "," +
           std::to_string(e.steps) + "]";
  return out + "], " + std::to_string(total) + " steps";
}

}  // namespace deal_change_detail

inline void DealChange::admitNewEntries(const std::vector<EpochSteps>& before,
                                        const std::vector<EpochSteps>& next, int64_t step,
                                        int64_t lag) {
  if (!ctx_.cfg.cluster_sync) return;
  for (const EpochSteps& e : next) {
    bool known = false;
    for (const EpochSteps& b : before) known = known || b == e;
    if (known || e.from_epoch == 0) continue;
    const int64_t at = firstStepOfEpoch(next, e.from_epoch) - lag;
    if (at > step) ctx_.cfg.cluster_sync->admitJoinersAt(at);
  }
}

inline uint64_t offerFingerprint(const std::string& text) {
  const uint64_t h = fnv1a64(text) & ((uint64_t(1) << 62) - 1);
  return h < 2 ? h + 2 : h;
}

inline bool DealChange::inForce(const nlohmann::json& offer) const {
  try {
    return dealFromJson(offer, "the deal a peers update gave " + ctx_.cfg.node.name) == feeder_.deal();
  } catch (const BadInput&) {
    return false;
  }
}

inline std::string DealChange::ownVerdict(const nlohmann::json& offer) {
  try {
    const std::vector<DealEntry> next = dealFromJson(offer, "the deal a peers update gave " + ctx_.cfg.node.name);
    if (next == feeder_.deal()) return "";
    RunPlan changed = plan_;
    feeder_.changeDeal(next, &changed, /*dry_run=*/true);
    return "";
  } catch (const BadInput& e) {
    return e.what();
  }
}

inline bool DealChange::atStep(int64_t step) {
  if (!ctx_.is_root || !ctx_.cfg.offered_deal) return false;
  const std::optional<nlohmann::json> offer = ctx_.cfg.offered_deal();
  ClusterSync* sync = ctx_.cfg.cluster_sync;
  if (!sync || !sync->agreesOnDeals()) {
    if (!offer) return false;
    return decide(*offer, offer->dump(), true, "", step, step, step);
  }
  // Together: decide the offer the last sync agreed on (the one proposed before it), then
  // propose the newest for the next sync.
  bool taken = false;
  const std::optional<DealAgreement> agreed = sync->takeDealAgreement();
  if (agreed && proposed_fingerprint_ != 0 && agreed->offer == proposed_fingerprint_) {
    // Decided afresh: judged where the leading cluster is, so every Root answers alike. Taken at
    // an earlier sync this cluster missed (it was paused or resuming): follow it if this cluster's
    // own epoch allows (judged at the leading step it would be refused while the others train
    // under it, and two deals would deal the same samples twice: the 24-volunteer soak).
    const int64_t leading = std::max(step, agreed->leading_steps_done);
    taken = decide(proposed_, proposed_text_, agreed->all_can_take, proposed_refusal_, step,
                   agreed->taken_before ? step : leading, leading);
    proposed_taken_ = proposed_taken_ || taken;
  }
  if (!offer) {
    // A Root without an offer does not abstain: the others' offer is not agreed until it has it.
    sync->proposeDeal(kNoOffer, true);
    return taken;
  }
  std::string text = offer->dump();
  if (text != proposed_text_) {
    proposed_ = *offer;
    proposed_fingerprint_ = offerFingerprint(text);
    proposed_text_ = std::move(text);
    proposed_refusal_ = ownVerdict(proposed_);
    proposed_taken_ = inForce(proposed_);
  }
  sync->proposeDeal(proposed_fingerprint_, proposed_refusal_.empty(), proposed_taken_);
  return taken;
}

inline bool DealChange::decide(const nlohmann::json& offer, const std::string& text,
                               bool all_can_take, const std::string& own_refusal, int64_t step,
                               int64_t judged_at, int64_t leading) {
  if (text == last_offer_) return false;
  last_offer_ = text;
  const std::string& name = ctx_.cfg.node.name;
  const int64_t epoch = plan_.epochOf(step);
  const int64_t judged_epoch = plan_.epochOf(judged_at);
  // "epoch": the epoch it was judged in (the leading cluster's, deciding together): a refusal as
  // too late there makes the coordinator deal again from a later epoch, not abandon the growth.
  auto report = [&](bool accepted, const std::string& reason) {
    ctx_.metrics.write({{"deal", {{"accepted", accepted}, {"deal", offer}, {"epoch", judged_epoch},
                                  {"step", step}, {"reason", reason}}}});
  };
  std::vector<DealEntry> next;
  try {
    next = dealFromJson(offer, "the deal a peers update gave " + name);
  } catch (const BadInput& e) {
    CAIRN_WARN("refused a new deal: ", e.what());
    report(false, e.what());
    return false;
  }
  const std::vector<DealEntry>& current = feeder_.deal();
  if (next == current) return false;
  if (dealUpTo(next, judged_epoch) != dealUpTo(current, judged_epoch)) {
    const std::string who = judged_at > step ? "the leading cluster" : "the cluster";
    const std::string why = who + " is already in epoch " + std::to_string(judged_epoch) +
                            " (step " + std::to_string(judged_at) + ") and the new deal " +
                            dealToJson(next).dump() + " changes it or an epoch before it";
    CAIRN_WARN("refused a new deal: ", why, "; the coordinator deals again from a later epoch");
    report(false, why);
    return false;
  }
  if (!all_can_take) {
    const std::string why =
        !own_refusal.empty() ? own_refusal
                             : "the Root of another cluster cannot take it (its log and metrics say why)";
    CAIRN_WARN("refused a new deal with every Root: ", why);
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
  CAIRN_INFO("data: took the new deal ", dealToJson(next).dump(), " at step ", step, " (epoch ",
             epoch, "): epoch steps ", deal_change_detail::tableText(plan_.epoch_steps, plan_.total_steps),
             leading > step ? "; " + std::to_string(leading - step) +
                                  " steps behind the leading cluster, which admits the new one "
                                  "at its first step"
                            : std::string());
  report(true, "");
  admitNewEntries(before, plan_.epoch_steps, step, leading - step);
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
  plan_ = next;
  changed_ = true;
  CAIRN_INFO("data: the Root took a new deal at step ", step, ": epoch steps ",
             deal_change_detail::tableText(plan_.epoch_steps, plan_.total_steps));
  if (ctx_.observer.on_plan) ctx_.observer.on_plan(plan_.total_steps, plan_.steps_per_epoch);
}

}  // namespace cairn
