// RingMembership: the join protocol of the cross-cluster rings (docs/PROTOCOL.md "Ring
// membership", docs/TRAINING.md "Lost and returning ring members").
//   joiner side   joinRings: ask every other member of every shared ring to admit this node, wait
//                 (up to 3 × timeout) for one welcome per ring, validate it against this stage's
//                 buckets and copy what it carries (parameters, buffers, DiLoCo θ_prev/momentum)
//                 into the stage; a welcome that does not fit is dropped with a warning. A ring
//                 whose every other member answered closed (they finished) is not waited for.
//   member side   collectJoinRequests: drain this ring's join requests from the mailbox (from
//                 ring members only); admit: after the commit of the sync that agreed on them,
//                 the lowest-ranked member of the view sends each joiner a welcome, and every
//                 member moves to the next generation with the joiners included. A member
//                 alone in its view also answers between syncs, from the state of its last sync
//                 (RingWelcomeDesk.h).
// Ownership: none (operates on RingClusterSync's rings and context). Thread-safety: joinRings on
// the trainer's thread before any ring thread runs; the others on the ring's own thread.
#pragma once

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "node/ring/RingState.h"

namespace cairn {

// True when at least one ring was joined through a welcome or closed (every other member left);
// the rings left without a welcome train alone. False: nobody answered (start together).
bool joinRings(RingContext& context, const std::vector<Ring*>& shared);
void collectJoinRequests(RingContext& context, Ring& ring);
// Member side, at an admission step (RingClusterSync::admitJoinersAt, admitClustersAt): waits
// until every member of each ring that is not in its view (of `clusters` only, when given: a
// member's index in RingSpec::members) has asked to join, or `deadline` (then logs who did not).
void awaitJoinRequests(RingContext& context, const std::vector<Ring*>& rings,
                       std::chrono::steady_clock::time_point deadline,
                       const std::set<int64_t>* clusters = nullptr);
void admit(RingContext& context, Ring& ring, const std::vector<std::string>& joiners);
// A welcome `m` on this ring's control tag: decoded and checked (its sender and view are ring
// members, the view holds this node and the sender, its tensors fit the stage's buckets), then
// copied into the stage and the ring's outer state, and its view and generation entered. False
// (logged, nothing changed) when it does not fit, or when `generation` is given and the welcome
// is into another one. Parameters that look corrupt next to this node's own copy are not taken;
// this node's own copy looking corrupt next to the welcome's throws BadInput (this node must not
// train on: RingSyncMath.h corruptNextTo; docs/TRAINING.md "A welcome is checked too").
// (node/ring/RingWelcomeAccept.cpp)
bool acceptWelcome(RingContext& context, Ring& ring, const Message& m,
                   std::optional<int64_t> generation = std::nullopt);
// The ring's members by name, the members a growth adds (Ring::expected_members) among them.
std::set<std::string> membersOf(const Ring& ring);
// A join request `m` on this ring's control tag: noted in Ring::join_requests when it is a valid
// request from a ring member other than this node (a non-member's is kept aside in
// Ring::strangers); anything else is dropped with a warning.
void noteJoinRequest(const RingContext& context, Ring& ring, const Message& m);
// The run ended here (RingClusterSync::finish): each member outside the view that asked to join
// (Ring::asker_lives, after draining the requests queued) is told, within `timeout` in all (the
// connected ones first, those whose connection is down last), that
// this node finished and will not admit it (RingJoin.h closed, naming the request's life). A
// joiner every other member of a ring told so stops waiting for that ring and trains without it,
// instead of waiting out 3 × the ring timeout for a welcome nobody will send. Not on a pause
// (leave): a paused member comes back asking to join, and its joiners start together with it.
void answerFinished(RingContext& context, Ring& ring, std::chrono::milliseconds timeout);
// The ring's tensors as a welcome carries them; `copy`: each its own copy (for a snapshot).
std::vector<NamedTensor> welcomeTensors(const Ring& ring, bool copy);
// Sends `message` (a welcome) to each joiner within the ring timeout; a failed send is logged
// (the joiner is then found lost at the next sync).
void sendWelcome(RingContext& context, const Ring& ring, const std::vector<std::string>& joiners,
                 const Message& message);

}  // namespace cairn
