// Growth: the coordinator's pure decision whether the waiting spares can hold one more whole
// pipeline (issue [J] "Growing"; docs/OPERATIONS.md "Growing"). No store, no sockets, no clock.
//   chooseGrowth  which spare holds each stage of the new cluster, or nothing
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

namespace cairn::coordinator {

// The RAM (GB) a member's probe reports; 0 when it has none.
double probedRamGb(const Member& m);

// The spare for each stage (index = stage), or nullopt when the spares cannot hold a pipeline and
// still leave `keep_spares` waiting.
std::optional<std::vector<Member>> chooseGrowth(const std::vector<Member>& members,
                                                const std::vector<double>& stage_ram_gb,
                                                int keep_spares);

}  // namespace cairn::coordinator
