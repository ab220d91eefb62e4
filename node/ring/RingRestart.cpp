#include "node/ring/RingRestart.h"

#include <algorithm>

#include "core/Log.h"
#include "node/protocol/CollectiveNotices.h"
#include "node/protocol/RingJoin.h"
#include "node/ring/RingMembership.h"
#include "node/ring/RingTransaction.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;

// What each member of the view brings to the start, in view order.
struct Arrival {
  uint64_t checksum = 0;
  int64_t last_synced_step = 0;
  bool restarting = false;
};

// All-gathers every member's Arrival; a member lost meanwhile is dropped and the gather repeated.
// Empty when this node is (or is left) alone.
std::vector<Arrival> gatherArrivals(RingContext& context, Ring& ring, bool restarting) {
  const torch::Tensor mine = torch::tensor(
      {int64_t(ring.checksum()), context.last_synced_step, int64_t(restarting ? 1 : 0)}, torch::kLong);
  const auto t0 = Clock::now();
  std::vector<torch::Tensor> all;
  for (;;) {
    if (!ring.group) return {};  // alone: nobody to compare with
    try {
      all = ring.group->allGather(mine);
      break;
    } catch (const PeerLost& e) {
      dropLost(context, ring, e);
    }
  }
  context.countStats([&](RingClusterSyncStats& s) {
    s.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  });
  std::vector<Arrival> arrivals;
  for (const auto& t : all) {
    const auto* v = t.data_ptr<int64_t>();
    arrivals.push_back({uint64_t(v[0]), v[1], v[2] != 0});
  }
  return arrivals;
}

// "m1 (cluster 1)": a member and its place in the ring.
std::string named(const Ring& ring, const std::string& member) {
  const auto& m = ring.spec.members;
  const auto at = std::find_if(m.begin(), m.end(), [&](const PeerRef& p) { return p.name == member; });
  return member + " (cluster " + std::to_string(at - m.begin()) + ")";
}

// The source of a restart: the newest last sync, ties to the lowest rank.
size_t sourceOf(const std::vector<Arrival>& arrivals) {
  size_t source = 0;
  for (size_t r = 1; r < arrivals.size(); ++r)
    if (arrivals[r].last_synced_step > arrivals[source].last_synced_step) source = r;
  return source;
}

// The source's side: a welcome to every other member, then the next generation.
void sendRestartWelcome(RingContext& context, Ring& ring) {
  const int64_t generation = ring.generation + 1;
  const std::vector<std::string> view = ring.view;
  Welcome welcome{context.node.name,        ring.spec.id,      generation,      view,
                  context.last_synced_step, ring.transactions, ring.checksum(),
                  welcomeTensors(ring, false)};
  std::vector<std::string> others;
  for (const auto& m : view)
    if (m != context.node.name) others.push_back(m);
  sendWelcome(context, ring, others, encode(welcome));
  context.countStats([&](RingClusterSyncStats& s) { s.last_welcome_checksum = welcome.checksum; });
  CAIRN_INFO("ring ", ring.spec.id, ": every member restarting; the others take this node's "
             "weights (its last sync at step ", context.last_synced_step, "), generation ",
             generation, ", view ", joinedNames(view), "; sent weights checksum ", welcome.checksum);
  regroup(context, ring, view, generation);
}

// The other members' side: the source's welcome into the next generation, within 2 × the ring
// timeout. False when none came (or none fitted).
bool takeRestartWelcome(RingContext& context, Ring& ring, const std::string& source) {
  const std::string tag = ringControlTag(ring.spec.id);
  const int64_t generation = ring.generation + 1;
  const auto deadline = Clock::now() + 2 * context.timeout;
  std::optional<Clock::time_point> stop_seen;
  for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
    checkStop(context, &stop_seen, "for " + source + "'s welcome");
    auto m = context.mailbox.receive(
        [&](const Message& x) {
          return x.kind == MessageKind::kCollective && x.tag == tag && x.sender == source &&
                 isWelcome(x);
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(std::min(deadline, now + kStopPoll) - now));
    if (m && acceptWelcome(context, ring, *m, generation)) return true;
  }
  return false;
}

void refuseDifferentStart(const Ring& ring, const std::vector<Arrival>& arrivals, size_t r) {
  CAIRN_THROW(BadInput, "ring ", ring.describe(), ": ", named(ring, ring.view[r]),
              " starts from different weights than ", named(ring, ring.view[0]), ": checksum ",
              arrivals[r].checksum, " vs ", arrivals[0].checksum,
              "; every cluster must start from the same stage weights (cut them from one "
              "model with one clusterize run). Refusing to train.");
}

// Leave and abort notices of this ring already in the mailbox are left over from the members'
// earlier lives (a member that paused to apply new peers told the group it left; the group of
// this life has the same id at generation 0): nobody can leave this life's group before this
// node's arrival is gathered, so they are thrown away. One still on its way is dropped by its
// stamp (CollectiveChannel::onNotice).
void dropEarlierNotices(RingContext& context, const Ring& ring) {
  const std::string& id = ring.spec.id;
  auto notice = [&id](const Message& m) {
    if (m.kind != MessageKind::kCollective || generationOfTag(m.tag, id) < 0) return false;
    const CollectiveMessageType type = collectiveMessageType(m);
    return type == CollectiveMessageType::kLeave || type == CollectiveMessageType::kAbort;
  };
  int dropped = 0;
  while (dropped < 4096 && context.mailbox.receive(notice, std::chrono::milliseconds(0))) ++dropped;
  if (dropped > 0)
    CAIRN_INFO("ring ", id, ": dropped ", dropped, " leave/abort notice(s) left over from the "
               "members' earlier lives");
}

}  // namespace

void startTogether(RingContext& context, Ring& ring, bool restarting) {
  dropEarlierNotices(context, ring);
  for (;;) {
    const std::vector<Arrival> arrivals = gatherArrivals(context, ring, restarting);
    if (arrivals.empty()) return;
    size_t differing = 0;
    bool everyone_restarting = true;
    for (size_t r = 0; r < arrivals.size(); ++r) {
      if (differing == 0 && arrivals[r].checksum != arrivals[0].checksum) differing = r;
      everyone_restarting = everyone_restarting && arrivals[r].restarting;
    }
    if (differing == 0) return;  // identical: nothing to agree on
    if (!everyone_restarting) refuseDifferentStart(ring, arrivals, differing);
    const std::string source = ring.view[sourceOf(arrivals)];
    if (source == context.node.name) {
      sendRestartWelcome(context, ring);
      return;
    }
    CAIRN_INFO("ring ", ring.spec.id, ": every member restarting, from different weights; taking ",
               named(ring, source), "'s (its last sync at step ",
               arrivals[sourceOf(arrivals)].last_synced_step, ", this node's ",
               context.last_synced_step, ")");
    if (takeRestartWelcome(context, ring, source)) return;
    dropMember(context, ring, source, false,
               "sent no welcome within " + std::to_string(2 * context.timeout.count()) + " ms");
  }
}

}  // namespace cairn
