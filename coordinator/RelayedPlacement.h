// RelayedPlacement: where the links between two dial-out-only volunteers cost least, when they
// cannot all be avoided (docs/OPERATIONS.md "Behind a home router", DialOutPlacement.h). A relayed
// link's bytes cross its relay's link twice (in and out), and a relay's bandwidth is shared among
// the links it carries, so every relayed byte is dear; the links of a plan differ by orders of
// magnitude in what they carry per step: a pipeline link carries a micro-batch's activations and
// gradients every micro-batch, a ring link a share of the stage's parameters once per sync
// (every local_steps steps with "average"/"diloco"). So, of the placements that swap only
// volunteers of equal figures (the plan itself unchanged), the coordinator takes the one whose
// relayed links carry the fewest bytes per step: relayed links go between clusters rather than
// inside a pipeline. The plan's report says what goes through the relays and what it costs.
// Pure functions. Thread-safety: none needed.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "clusterize/PartitionPlan.h"
#include "coordinator/CoordinatorStore.h"
#include "core/NodeData.h"

namespace cairn::coordinator {

using LinkBytes = std::map<std::pair<std::string, std::string>, double>;  // (lesser, greater) → bytes

// Bytes each link of the plan carries per training step, both ways: a pipeline link 2 × the cut's
// wire bytes × micro-batches; a ring link (any two members of a ring of n) 2 × the stage's
// parameter bytes (fp32) / n per sync, divided by training_definition.local_steps for "average"
// and "diloco" (every step for "gradients"). Keyed by the nodes' names as the plan has them.
LinkBytes linkBytesPerStep(const clusterize::PartitionPlan& plan, const JobSpec& job);

// For the volunteers as the planner saw them (slot i: volunteers[i]'s figures, `bytes` keyed by
// those names), which volunteer takes each slot so that the links joining two dial-out-only
// volunteers carry the fewest bytes per step, swapping only volunteers of equal memory and GPU
// count: every placement when there are at most 20,000 per swap class, else swaps of one
// dial-out-only and one reachable volunteer while they help. Returns the identity when nothing
// is better than the planner's own placement.
std::vector<size_t> cheapestRelayedSlots(const LinkBytes& bytes, const std::vector<Member>& volunteers);

// The bytes per step of `bytes`' links whose two ends are both in `dial_out_only` (relayed).
double relayedBytesPerStep(const LinkBytes& bytes, const std::vector<std::string>& dial_out_only);

}  // namespace cairn::coordinator
