// RingState: one ring's state — its view (live members, cluster order), generation, ProcessGroup,
// join requests, committed transactions and tensors (RingBuckets) — and RingContext, what the
// rings of one node share (mailbox, node, options, statistics). Also the two view changes every
// part of the ring protocol uses: regroup (a new view/generation: a fresh ProcessGroup with group
// id "<ring id>@<g>", g > 0, and this ring's older-generation messages dropped from the mailbox)
// and dropMember (a lost or leaving member out, next generation).
//
// Ownership: RingClusterSync owns the RingContext and every Ring; a Ring owns its ProcessGroup;
// the context borrows the Mailbox. Thread-safety: a Ring is used by one thread at a time (its
// ring thread during a sync); RingContext's statistics are updated under its mutex (countStats),
// everything else in it is read-only while ring threads run.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "node/transport/Mailbox.h"
#include "node/collectives/ProcessGroup.h"
#include "node/ring/RingBuckets.h"
#include "trainer/TrainOptions.h"

namespace cairn {

class TensorPlacement;  // trainer/Device.h

struct RingClusterSyncStats {
  int64_t syncs = 0;           // averages / outer steps done
  int64_t gradient_syncs = 0;  // gradient all-reduces done
  double seconds = 0;          // in collectives, all calls together
  uint64_t bytes_sent = 0;     // tensor bytes, all rings together
  int64_t members_lost = 0;    // members dropped after a timeout, abort or disconnect
  int64_t members_left = 0;    // members dropped because they announced leave()
  int64_t members_joined = 0;  // joiners admitted by this node's rings (this node as joiner: 0)
  int64_t redone_syncs = 0;    // sync attempts restored and redone after a loss
  // "gradients" with overlap: gradient syncs whose buckets went through the communication
  // threads (GradientOverlap.h), and how many buckets started their all-reduce while backward was
  // still running (depends on timing: for reports, not for tests).
  int64_t overlapped_gradient_syncs = 0;
  int64_t buckets_reduced_in_backward = 0;
  // Of those syncs' buckets, how many the backward that finished them copied out to the host
  // itself (on a device whose copies run behind the host; GradientOverlap.h). Deterministic: every
  // bucket whose parameters all get a gradient in the last backward.
  int64_t buckets_copied_in_backward = 0;
  int64_t joined_rings = 0;    // rings this node joined through a welcome (setJoining)
  // Rings in which every other member answered this node's join request with closed (they finished
  // their run): this node trains without them (setJoining).
  int64_t closed_rings = 0;
  uint64_t last_welcome_checksum =
      0;  // FNV-1a of the ring tensors sent/received in the last welcome
};

// Ring members whose process was replaced while this node runs (a spare took their node over;
// the coordinator's peers update re-pointed them: RingClusterSync::markReplaced). A group made
// before a member was marked fails at once when it waits on it (ProcessGroupOptions::replaced),
// instead of waiting out the timeout on a process that is gone while its replacement, still
// replaying from its checkpoint, asks to join; the ring drops the member (next generation) and
// admits the replacement at a later sync. Groups made after the mark (the one that admits the
// replacement) are not affected. Thread-safety: own mutex (marked from the coordinator's thread,
// read by ring threads).
class ReplacedMembers {
 public:
  void mark(const std::vector<std::string>& names) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++epoch_;
    for (const std::string& n : names) marked_[n] = epoch_;
  }
  uint64_t epoch() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return epoch_;
  }
  // Marked after `epoch` (a group made at that epoch still counts on its old process).
  bool since(const std::string& name, uint64_t epoch) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = marked_.find(name);
    return it != marked_.end() && it->second > epoch;
  }

 private:
  mutable std::mutex mutex_;
  uint64_t epoch_ = 0;
  std::map<std::string, uint64_t> marked_;
};

// The lives (RingContext::life) each ring peer's join requests carried, for all the rings of a
// node together: the first request of a life the node has not seen from that peer means its
// process (re)started, possibly at the same address a moment ago, while this node's connection to
// it may still end at the old process: `firstSight` then runs `redial` (Transport::redial) before
// it returns, and before any other thread's firstSight returns, so no answer to the new life (a
// welcome) leaves over the old connection. A late request of a life seen before (one queued
// before its sender restarted) dials nothing: dialling again would drop what is queued for the
// new life. Thread-safety: own mutex (ring threads, the welcome desk and the trainer's thread
// note requests).
class PeerLives {
 public:
  static constexpr size_t kLivesKept = 16;  // per peer, the latest (a peer restarting more often
                                            // than that between two of its requests is not met)
  // True when `life` (non-zero) was not seen from `peer` before; `redial(peer)` was then run.
  template <typename Redial>
  bool firstSight(const std::string& peer, uint64_t life, Redial&& redial) {
    if (life == 0) return false;  // a request without a life: nothing to tell lives apart by
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<uint64_t>& seen = seen_[peer];
    if (std::find(seen.begin(), seen.end(), life) != seen.end()) return false;
    if (seen.size() == kLivesKept) seen.erase(seen.begin());
    seen.push_back(life);
    redial(peer);
    return true;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::vector<uint64_t>> seen_;  // oldest first
};

// What the rings of one node share.
struct RingContext {
  RingContext(Mailbox& mailbox, NodeSpec node, SyncOptions sync, std::chrono::milliseconds timeout)
      : mailbox(mailbox), node(std::move(node)), sync(sync), timeout(timeout) {}

  Mailbox& mailbox;
  const NodeSpec node;
  // A random number of this process's rings, never 0: its join requests carry it, and a member
  // that finishes its run answers a joiner it did not admit with it (RingJoin.h closed), so an
  // answer meant for an earlier life of this node is not taken.
  const uint64_t life = newLife();
  const SyncOptions sync;
  const std::chrono::milliseconds timeout;
  ProcessGroupOptions group_options;  // set by the constructor of RingClusterSync, then read-only
  // Where the stage trains (ClusterSync::setPlacement, before start; null: the CPU). On a device
  // whose copies run behind the host (a GPU's), the overlapped gradient all-reduce copies each
  // bucket out as backward finishes it (GradientOverlap.h).
  std::shared_ptr<const TensorPlacement> placement;
  // Shared with every group's ProcessGroupOptions::replaced (regroup).
  const std::shared_ptr<ReplacedMembers> replaced = std::make_shared<ReplacedMembers>();
  // The lives of the ring peers' join requests (noteJoinRequest redials a peer at a new one).
  const std::shared_ptr<PeerLives> peer_lives = std::make_shared<PeerLives>();
  int64_t last_synced_step = 0;       // optimizer steps done at the last sync (trainer's thread)
  // The stage's copy was loaded from a checkpoint another process wrote (set before start():
  // ClusterSync::setResumedFromAnotherProcess); read by acceptWelcome, which start() alone calls.
  bool copy_from_another_process = false;
  // The deal offer this node proposes at its syncs (ClusterSync::proposeDeal; 0: none, it
  // abstains) and whether its own checks allow it. Set on the trainer's thread between syncs.
  uint64_t deal_offer = 0;
  bool deal_can_take = true;
  bool deal_taken = false;  // this node already took the offer it proposes
  // Joiners admitted together (RingClusterSync::gateAdmissions; docs/TRAINING.md "Lost and
  // returning ring members"): set before start(). While gated, a sync admits only the joiners of
  // the clusters in `admitting` (a ring member's index in RingSpec::members is its cluster), or
  // every joiner with `admit_all` (a growth admission step); both set by the trainer's thread
  // around one synchronize(), read by the ring threads during it.
  bool gated = false;
  std::set<int64_t> admitting;
  bool admit_all = false;

  // Guards stats and bytes_retired, which the ring threads of one call update together.
  mutable std::mutex stats_mutex;
  RingClusterSyncStats stats;
  uint64_t bytes_retired = 0;  // sent by the groups of earlier generations

  static uint64_t newLife();

  template <typename F>
  void countStats(F&& update) {
    std::lock_guard<std::mutex> lock(stats_mutex);
    update(stats);
  }
};

// One ring group: its ProcessGroup and the module tensors it brings together (RingBuckets).
struct Ring : RingBuckets {
  RingSpec spec;
  std::vector<std::string> view;  // live members, cluster order
  int64_t generation = 0;
  std::unique_ptr<ProcessGroup> group;  // null while the view is this node alone
  std::set<std::string> join_requests;  // members that asked to be admitted
  // Join requests from names not (yet) members: a ring member added mid-run (a new cluster,
  // RingClusterSync::addMembers) may ask before this node has applied the addition. At most
  // kMaxStrangers names; moved to join_requests when the name becomes a member.
  std::set<std::string> strangers;
  // The ring's members with those a growth added that this node still holds for their admission
  // (RingClusterSync::addMembers; empty when none), set before it joins: the others may have
  // admitted them meanwhile, so a welcome whose view names them is taken, and they become members
  // (a cluster that resumed after the growth's admission dropped every such welcome as naming a
  // non-member: the 24-volunteer soak, seed 2).
  std::vector<PeerRef> expected_members;
  // The ring's members with those a growth added that this node holds for an admission step it
  // has not reached or never armed (RingClusterSync::held_; empty when none), copied before each
  // sync: when another member admits them at that sync, this node takes them in too
  // (agreeOnJoiners), so the ring admits them at one sync even where this node lost track of the
  // admission step (a Root that took the deal, then resumed from an older checkpoint within the
  // same run: the 24-volunteer soak, seed 2).
  std::vector<PeerRef> held_members;
  static constexpr size_t kMaxStrangers = 64;
  // Each member that asked to join: the life its latest request carried (0: none given). Kept
  // after its request is dropped (a dropped member's old request is forgotten, but the joiner
  // may still be waiting): a member that finishes its run answers each asker outside its view with
  // a closed message naming that life (RingMembership.h answerFinished).
  std::map<std::string, uint64_t> asker_lives;
  int64_t transactions = 0;             // syncs of this ring committed (or kept) by this node
  // "average" mode: resultChecksum of the ring's tensors as its last committed sync left them (or
  // start(), or a welcome): bit-identical on every member, compared at the next sync
  // (RingSyncMath.h checkContributions). Unset in the other modes.
  std::optional<uint64_t> result_sum;
  bool alone_logged = false;
  // What a welcome needs, as of this ring's last committed admitting sync (or start()): kept only
  // while the view lacks some member (someone may ask to join), so that a join request is
  // answered between syncs (RingMembership.h welcomeBetweenSyncs) from a consistent state, not
  // from tensors the trainer has moved on since. Outside "gradients" mode only.
  struct WelcomeSnapshot {
    int64_t generation = 0;    // the ring's generation when it was taken
    int64_t transactions = 0;  // the ring's committed transactions then
    int64_t step = 0;          // the node's optimizer steps at that sync
    uint64_t checksum = 0;     // RingBuckets::checksum of the tensors below
    std::vector<NamedTensor> tensors;  // value.<i>, previous.<i>, momentum.<i> (own copies)
  };
  std::optional<WelcomeSnapshot> welcome_snapshot;
  // Set with the snapshot while this node is alone in the view (a join request can be answered
  // between syncs); read without the ring's lock by the welcome desk, which looks at the mailbox
  // only while some ring is ready. A hint: welcomeBetweenSyncs checks again under the lock.
  std::atomic<bool> welcome_ready{false};
  // The deal proposals of the members at this ring's last admitting sync (transact): the largest
  // and smallest offer proposed (0 / 0: nobody proposed), whether any proposer refused it, and
  // the most steps any member had done (RingContext::last_synced_step).
  struct DealTally {
    bool counted = false;  // a sync counted them since RingClusterSync last read it
    uint64_t max_offer = 0, min_offer = 0;
    bool any_cannot = false;
    int64_t max_steps_done = 0;
    bool any_taken = false;  // some proposer had already taken its offer
  } deal_tally;
  // Gated: the clusters whose members this ring agreed had asked to join but were not admitted
  // (not in RingContext::admitting), since RingClusterSync last took them (ring's thread in a
  // sync; the trainer's thread between).
  std::set<int64_t> asked_clusters;

  // "<id> (<first parameter names>…)", for error messages.
  std::string describe() const;
  // The ring's checksum (RingBuckets::checksum over the ring's tensor names).
  uint64_t checksum() const { return RingBuckets::checksum(spec.parameters); }
};

// "[a,b,c]", for logs.
std::string joinedNames(const std::vector<std::string>& names);

// Generation of a collective tag "coll:<ring>[@<g>]" of ring `ring_id`; -1 for other tags.
int64_t generationOfTag(const std::string& tag, const std::string& ring_id);

// "average" mode: notes the ring's tensors as they are now as its last result (Ring::result_sum).
void noteResult(const RingContext& context, Ring& ring);

// A new view/generation: a fresh ProcessGroup (or none when alone), and what is left in the
// mailbox of this ring's earlier generations thrown away.
void regroup(RingContext& context, Ring& ring, std::vector<std::string> view, int64_t generation);
// `lost` out of the view (it `left`, or was lost: `why`), next generation.
void dropMember(RingContext& context, Ring& ring, const std::string& lost, bool left,
                const std::string& why);

// The ring protocol's own waits (a welcome, join requests, the coordinator's added members) and
// a stop asked of this node: checkStopAsked (CollectiveChannel.h) with the groups' options, so
// they give up as a group's wait does; `*seen` is one per wait. The waits look at least every
// kStopPoll.
void checkStop(const RingContext& context, std::optional<std::chrono::steady_clock::time_point>* seen,
               const std::string& what);
constexpr std::chrono::milliseconds kStopPoll{250};

}  // namespace cairn
