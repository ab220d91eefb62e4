// RingTransaction: every sync of a ring (average, DiLoCo, gradients, buffer average) as a
// transaction that survives the loss of members.
//   copy      the ring's tensors (and gradients, θ_prev, momentum) are copied first (the restore
//             point; a sync holds one copy of each ring's tensors while it runs);
//   admit     with `admit`, the members first agree on the join requests (a max-all-reduce of one
//             flag per ring member), and the joiners are admitted after the commit; the same
//             all-reduce tallies the members' deal proposals (Ring::deal_tally; DealChange.h);
//   work      the reductions of the mode;
//   commit    a barrier.
// When a member is lost (PeerLost: a timeout, an abort naming it, its leave message, or the
// transport reporting it disconnected), every live member drops the member the PeerLost names
// (ProcessGroup's abort makes every survivor name the same one), moves to generation g+1, then
// recovers: the survivors agree (a max-all-reduce of 2·S + "my work phase did not complete", S =
// transactions committed so far) whether the failed attempt stands. A member found dying inside
// the commit barrier has sent everything, so those who completed the reductions keep them, and a
// member behind the others (they committed and went on) keeps its result instead of redoing a sync
// nobody else will redo. Otherwise everyone restores the copy and redoes the sync among the
// survivors. A ring left with only this node makes its syncs no-ops (logged once).
// Known limit: a join admitted at the very sync where a member is lost inside the commit barrier
// can split the view (the admitting side moved on); the next loss detection repairs neither.
//
// Ownership: none (operates on one Ring of RingClusterSync). Thread-safety: the ring's thread.
#pragma once

#include <functional>

#include "core/Error.h"
#include "node/ring/RingState.h"

namespace cairn {

// Runs `work` on `ring` as a transaction: redone among the survivors after a loss; with
// `admit_joiners`, join requests are agreed on first and joiners admitted after the commit.
void transact(RingContext& context, Ring& ring, bool gradients, bool admit_joiners,
              const std::function<void()>& work);
// After a loss (the lost member already dropped): the survivors' vote whether the failed attempt
// stands (true: keep its result) or is restored and redone (false); `work_done`: this node's work
// phase completed. transact uses it; so does the overlapped gradient all-reduce
// (GradientOverlap.h), whose first attempt runs outside transact.
bool recover(RingContext& context, Ring& ring, bool work_done);
// Drops the member a PeerLost `e` of the ring's group names (dropMember: the next generation
// without it); call it from the handler of `e`: one that names nobody is rethrown as it is.
void dropLost(RingContext& context, Ring& ring, const PeerLost& e);
// The handling of a PeerLost `e` in a ring's transaction (its work or its commit), shared by
// transact and GradientOverlap::complete; call it from the handler of `e`. Drops the member `e`
// names (rethrows `e` when it names nobody), then the survivors vote (recover). True: the attempt
// stands (logged). False: `restore` has put the restore point back and the redo is counted; the
// caller redoes the sync among the survivors.
bool settleLoss(RingContext& context, Ring& ring, const PeerLost& e, bool work_done,
                const std::function<void()>& restore);
// The end of a committed transaction: counted, and the join requests of the view's members (who
// took part) dropped as stale.
void commitTransaction(Ring& ring);

}  // namespace cairn
