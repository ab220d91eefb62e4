// RingRestart: how a ring starts when no member welcomes the others (docs/TRAINING.md "Lost and
// returning ring members", "Every cluster restarting at once").
//   fresh start   the run's first start: the members all-gather a checksum of their tensors
//                 (names, dtypes, shapes, bytes) and refuse to train (BadInput) unless all are
//                 equal: every cluster must start from the same cut of one model.
//   restart       every member is restarting together (each resumed its cluster from its own
//                 checkpoint: two clusters replaced a volunteer at once, or the whole run was
//                 restarted), so nobody is live to welcome the others, and the clusters' checkpoints
//                 may be of different steps or between syncs. The members all-gather (checksum,
//                 step of their last sync, restarting); when the checksums differ, the member whose
//                 last sync is newest (ties: the lowest rank) is the source: it sends every other
//                 member a welcome (RingJoin.h; its parameters, buffers and DiLoCo θ_prev/momentum)
//                 and all enter the next generation, as a live member admits a joiner. A member
//                 that is not restarting (a fresh start beside a restart) makes it a fresh start.
// A member lost meanwhile (PeerLost: gone, or replaced by a spare whose process rejoins through the
// join protocol later) is dropped from the view and the agreement done again among the others; a
// source that sends no welcome within 2 × the ring timeout is dropped the same way. A member found
// alone is done. Leave and abort notices of the members' earlier lives (the group of generation 0
// has the same id in every life) are thrown away first, or stamped too far ahead to count
// (CollectiveChannel::onNotice).
// Ownership: none (operates on one Ring of RingClusterSync). Thread-safety: the ring's thread
// (RingClusterSync::start, before any other ring thread runs).
#pragma once

#include "node/ring/RingState.h"

namespace cairn {

// `restarting`: this node resumed (RingClusterSync::setJoining) and no ring peer welcomed it.
void startTogether(RingContext& context, Ring& ring, bool restarting);

}  // namespace cairn
