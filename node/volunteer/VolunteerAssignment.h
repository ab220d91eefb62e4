// VolunteerAssignment: the checks a volunteer makes on the coordinator's `assignment` before it
// writes anything (docs/PROTOCOL.md "Coordination"): the name is the one the coordinator accepted
// it as (and a safe folder name), node.json and job.json validate (parseNodeSpec/parseJobSpec),
// they name the same job, node.json's extra.public_key (when present) is this volunteer's own key,
// the stage bytes load as TorchScript, and a checkpoint it carries (a spare taking over a lost
// node) says its step. The `peers` update of a running volunteer is checked too: the same node,
// only its peers' addresses and keys changed.
// Any problem is BadInput naming the coordinator (address and key) and what was wrong.
// Pure functions; any thread.
#pragma once

#include <string>

#include "node/volunteer/VolunteerWorkdir.h"
#include "node/protocol/Coordination.h"

namespace cairn {

// Who sent it, for messages: "the coordinator at 10.0.0.5:7000 (key Xyz…)".
std::string describeCoordinator(const Invite& invite);

// A name the coordinator gives a volunteer becomes a folder name: 1..128 of [A-Za-z0-9_.-], not
// "." or "..". Returns the reason when it is not ("" when it is).
std::string whyNotANodeName(const std::string& name);

// Validates `assignment` for the volunteer `accepted_name` holding `own_public_key`, sent by
// `coordinator` (for messages). Sets node.extra.num_clusters from the message and
// node.extra.public_key to `own_public_key`.
CheckedAssignment checkAssignment(const Assignment& assignment, const std::string& accepted_name,
                                  const std::string& own_public_key, const std::string& coordinator);

// provider --join --memory-gb: the sentence with which a volunteer giving `memory_gb` GB refuses
// the node `node` (its estimates.memory_bytes needs more), or "" when it fits or `memory_gb` is 0
// (no limit). ("refused node node_3: its stage needs an estimated 5.10 GB and this volunteer
// gives 4.00 GB (--memory-gb)")
std::string whyTooBigForVolunteer(const NodeSpec& node, double memory_gb);

// Validates `update` (docs/PROTOCOL.md `peers`) against the node.json the volunteer runs now:
// the same name, job, cluster, stage, role, stage file and own address, and (when present) this
// volunteer's public key; only upstream/downstream/ring peers may differ. Returns the new
// node.json (extra.public_key and extra.num_clusters kept). BadInput naming `coordinator` and what
// is wrong.
NodeSpec checkPeersUpdate(const PeersUpdate& update, const NodeSpec& current,
                          const std::string& own_public_key, const std::string& coordinator);

}  // namespace cairn
