// Credit: what each volunteer gave the run (docs/OPERATIONS.md "Credit"), kept per volunteer key
// and per node it held, in coordinator.db (CoordinatorStore's credit table):
//   creditRecords     a member's newly taken metrics records, in order: each step record credits
//                     that step of its node to the member's key with its figures (samples,
//                     compute_s, sent_bytes; the newest record of a step wins); {"resumed_from": S}
//                     forgets the node's steps after S (the resume rolled them back: not kept)
//   creditCheckpoint  a checkpoint of step S received: the node's steps up to S nobody holds are
//                     credited to the uploader's key without figures (its records may still be on
//                     their way, or lost with a killed volunteer; a record that comes replaces
//                     them); never beyond the run's planned steps (nor, before the plan is known,
//                     the highest step any record credited)
//   creditJson        the totals for run_result.json, the live page and /metrics, each with the
//                     volunteer's current member name
// So each kept step of a node is credited to exactly one key. Credit is a record of what the
// volunteers reported and the run kept, not a proof of work: a volunteer's figures are its own.
// Records that are not well-formed or out of bounds are skipped (counted in the return value).
// Thread-safety: the coordinator's thread (the store's).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/CoordinatorStore.h"

namespace cairn::coordinator {

// Returns how many step or resume records were skipped as malformed.
size_t creditRecords(CoordinatorStore& store, const std::string& key, const std::string& node,
                     const std::vector<nlohmann::json>& records);
// `planned_steps`: RunView::plannedSteps (0: not known yet).
void creditCheckpoint(CoordinatorStore& store, const std::string& key, const std::string& node,
                      int64_t step, int64_t planned_steps);
// [{"volunteer": current member name (or the key when no member has it), "key", "node", "steps",
//   "samples", "compute_s", "sent_bytes"}], by key then node.
nlohmann::json creditJson(const std::vector<CreditTotal>& totals, const std::vector<Member>& members);

}  // namespace cairn::coordinator
