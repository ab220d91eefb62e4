#include "node/ring/RingMembership.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/Log.h"
#include "node/protocol/RingJoin.h"
#include "node/ring/RingTransaction.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kJoinRequestSendTimeout{200};
constexpr std::chrono::milliseconds kJoinRequestRepeat{1000};

}  // namespace

std::set<std::string> membersOf(const Ring& ring) {
  std::set<std::string> members;
  for (const auto& m : ring.spec.members) members.insert(m.name);
  for (const auto& m : ring.expected_members) members.insert(m.name);
  return members;
}

// A join request from a ring member other than this node is noted; anything else is dropped with
// a warning.
void noteJoinRequest(const RingContext& context, Ring& ring, const Message& m) {
  // A closed answer to a join request this node no longer makes (it was admitted, or gave up).
  if (isClosed(m)) return;
  std::string why;
  const auto request = decodeJoinRequest(m, &why);
  if (!request) {
    CAIRN_WARN("ring ", ring.spec.id, ": dropped a message from \"", m.sender, "\": ", why);
    return;
  }
  if (request->sender == context.node.name) return;
  if (!membersOf(ring).count(request->sender)) {
    if (ring.strangers.size() < Ring::kMaxStrangers && ring.strangers.insert(request->sender).second)
      CAIRN_WARN("ring ", ring.spec.id, ": join request from non-member \"", request->sender,
                 "\" kept aside; it counts only if the coordinator adds it to the ring");
    return;
  }
  // A new life of the sender: it (re)started, perhaps a moment ago at the same address, and this
  // node's connection to it may still end at its old process; dialled again before any answer.
  if (context.peer_lives->firstSight(request->sender, request->life, [&context](const std::string& p) {
        context.mailbox.transport().redial(p);
      }))
    CAIRN_DEBUG("ring ", ring.spec.id, ": ", request->sender, " asks with a new life; dialled again");
  ring.join_requests.insert(request->sender);
  ring.asker_lives[request->sender] = request->life;
}

void answerFinished(RingContext& context, Ring& ring, std::chrono::milliseconds timeout) {
  collectJoinRequests(context, ring);
  // The connected askers first (each send takes at once), those whose connection is down last:
  // one killed since it asked would hold up the others for a whole timeout each (the 24-volunteer
  // soak: 3 s per dead asker at the end of a run). So they share `timeout` in all.
  Transport& transport = context.mailbox.transport();
  auto rank = [&transport](const std::string& name) {
    const PeerState state = transport.liveness(name).state;
    return state == PeerState::kConnected ? 0 : state == PeerState::kUnknown ? 1 : 2;
  };
  std::vector<std::pair<int, std::pair<std::string, uint64_t>>> askers;
  for (const auto& [name, life] : ring.asker_lives)
    if (life != 0 && name != context.node.name &&
        std::find(ring.view.begin(), ring.view.end(), name) == ring.view.end())
      askers.push_back({rank(name), {name, life}});
  std::stable_sort(askers.begin(), askers.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> told;
  for (const auto& [ranked, asker] : askers) {
    const auto& [name, life] = asker;
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    const SendStatus status =
        context.mailbox.send(name, encode(Closed{context.node.name, ring.spec.id, life}), left);
    if (status == SendStatus::kSent)
      told.push_back(name);
    else
      CAIRN_INFO("ring ", ring.spec.id, ": could not tell ", name, " (it asked to join) that this "
                 "node finished its run (", toString(status),
                 "); it waits for a welcome until its timeout");
  }
  if (!told.empty())
    CAIRN_INFO("ring ", ring.spec.id, ": told ", joinedNames(told),
               " (asking to join, not admitted) that this node finished its run");
}

// The ring's tensors as a welcome carries them (value.<i>, previous.<i>, momentum.<i>); `copy`:
// every tensor its own copy (a snapshot kept past this call), else fresh or shared as they are.
std::vector<NamedTensor> welcomeTensors(const Ring& ring, bool copy) {
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < ring.buckets.size(); ++i) {
    const auto& b = ring.buckets[i];
    const std::string n = std::to_string(i);
    if (b.numel > 0) {
      torch::Tensor value = ring.flatten(b, false).contiguous();
      tensors.push_back({"value." + n, copy ? value.clone() : value});
    }
    if (b.previous.defined()) tensors.push_back({"previous." + n, b.previous.clone()});
    if (b.momentum.defined()) tensors.push_back({"momentum." + n, b.momentum.clone()});
  }
  return tensors;
}

void sendWelcome(RingContext& context, const Ring& ring, const std::vector<std::string>& joiners,
                 const Message& message) {
  for (const auto& j : joiners) {
    const SendStatus status = context.mailbox.send(j, message, context.timeout);
    if (status != SendStatus::kSent)
      CAIRN_WARN("ring ", ring.spec.id, ": welcome to ", j, " not sent (", toString(status),
                 "); it will be found lost at the next sync");
  }
}

namespace {

// Asks every other member of `ring` to admit this node (best effort).
void askToJoin(RingContext& context, const Ring& ring) {
  const Message request = encode(JoinRequest{context.node.name, ring.spec.id, context.life});
  for (const auto& m : ring.spec.members)
    if (m.name != context.node.name)
      (void)context.mailbox.send(m.name, request, kJoinRequestSendTimeout);
}

// Every other member of every shared ring is itself asking to join (all restarting): each asked
// during this joinRings (`heard`). A request queued before it may be stale: its sender may have
// stopped asking since (a stage stopped and started again to apply new peers); a joiner that still
// waits asks again every kJoinRequestRepeat.
bool everyoneJoining(const RingContext& context, const std::vector<Ring*>& shared,
                     const std::set<std::string>& heard) {
  for (Ring* ring : shared)
    for (const auto& m : ring->spec.members)
      if (m.name != context.node.name && !heard.count(m.name)) return false;
  return true;
}

// The shared ring whose control tag `tag` is; null for none.
Ring* ringOfTag(const std::vector<Ring*>& shared, const std::string& tag) {
  Ring* ring = nullptr;
  for (Ring* r : shared)
    if (tag == ringControlTag(r->spec.id)) ring = r;
  return ring;
}

// Where each shared ring stands while this node joins: welcomed (`done`), or every other member
// answered closed (`closed`, with who did so far in `closed_by`).
struct JoinProgress {
  std::set<Ring*> done, closed;
  std::map<Ring*, std::set<std::string>> closed_by;
  size_t settled() const { return done.size() + closed.size(); }
  bool open(Ring* ring) const { return !done.count(ring) && !closed.count(ring); }
};

// A closed answer `m` on `ring`'s tag: counted when it answers this life's request and comes from
// a ring member; the ring is closed once every other member answered so.
void takeClosed(const RingContext& context, Ring& ring, JoinProgress& progress, const Message& m) {
  std::string why;
  const auto closed = decodeClosed(m, &why);
  if (!closed) {
    CAIRN_WARN("ring ", ring.spec.id, ": dropped a message from \"", m.sender, "\": ", why);
    return;
  }
  if (closed->life != context.life || !membersOf(ring).count(closed->sender)) return;  // not ours
  auto& by = progress.closed_by[&ring];
  by.insert(closed->sender);
  for (const auto& member : ring.spec.members)
    if (member.name != context.node.name && !by.count(member.name)) return;
  progress.closed.insert(&ring);
}

// One message on a shared ring's control tag while joining: a join request is noted; a closed
// answer is counted; a welcome into a ring still open is applied when it fits.
void takeJoinAnswer(RingContext& context, Ring& ring, JoinProgress& progress, const Message& m) {
  if (isClosed(m)) {
    if (progress.open(&ring)) takeClosed(context, ring, progress, m);
  } else if (!isWelcome(m)) {
    noteJoinRequest(context, ring, m);
  } else if (progress.open(&ring) && acceptWelcome(context, ring, m)) {
    progress.done.insert(&ring);
  }
}

// The end of joinRings: false when no ring welcomed this node and none was closed; otherwise the
// rings without a welcome go on with this node alone: those closed (every other member finished
// its run) and those that sent nothing within `wait`.
bool finishJoining(RingContext& context, const std::vector<Ring*>& shared,
                   const JoinProgress& progress, std::chrono::milliseconds wait) {
  if (progress.settled() == 0) {
    CAIRN_WARN("cross-cluster sync: no ring peer admitted ", context.node.name,
               " (every cluster starting or resuming together?): starting together with the "
               "others (RingRestart.h)");
    return false;
  }
  for (Ring* ring : shared) {
    if (progress.done.count(ring)) continue;
    if (progress.closed.count(ring)) {
      CAIRN_WARN("ring ", ring->spec.id, ": every other member finished its run; this node trains "
                 "without the ring (its syncs are no-ops)");
      context.countStats([](RingClusterSyncStats& s) { ++s.closed_rings; });
    } else {
      CAIRN_WARN("ring ", ring->spec.id, ": no welcome within ", wait.count(),
                 " ms; this node trains without the ring (its syncs are no-ops)");
    }
    regroup(context, *ring, {context.node.name}, 0);
  }
  return true;
}

}  // namespace

// Joining: ask every other member of every shared ring to admit this node; wait (up to the ring
// timeout in all) for one welcome per ring and copy what it carries into the stage.
bool joinRings(RingContext& context, const std::vector<Ring*>& shared) {
  if (shared.empty()) return false;
  for (Ring* ring : shared) collectJoinRequests(context, *ring);  // queued before: noted, not heard
  for (Ring* ring : shared) askToJoin(context, *ring);
  // A member that restarted quickly may still be in the live members' view: they need up to two
  // timeouts to drop it (ProcessGroup's keep-alive rule), then up to local_steps steps to reach a
  // sync boundary. Hence three timeouts, unless every other member is itself asking to join.
  const auto wait = 3 * context.timeout;
  CAIRN_INFO("cross-cluster sync: asked the ring peers to admit ", context.node.name, " (",
             shared.size(), " ring(s)); waiting up to ", wait.count(), " ms for a welcome");
  const auto deadline = Clock::now() + wait;
  JoinProgress progress;
  std::set<std::string> heard;  // members whose join request came during this call
  // Requests are sent again every second to the rings not joined yet: a member that is told about
  // this node only now (a new cluster, RingClusterSync::addMembers) may have refused the first
  // connection, or dropped the request before it knew the name.
  auto next_ask = Clock::now() + kJoinRequestRepeat;
  std::optional<Clock::time_point> stop_seen;
  while (progress.settled() < shared.size()) {
    checkStop(context, &stop_seen, "for a welcome into its rings");
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (now >= next_ask) {
      for (Ring* ring : shared)
        if (progress.open(ring)) askToJoin(context, *ring);
      next_ask = Clock::now() + kJoinRequestRepeat;
    }
    if (progress.settled() == 0 && everyoneJoining(context, shared, heard)) {
      CAIRN_INFO("cross-cluster sync: every other ring member is joining too (all restarting)");
      // Once more, so that a member whose wait began after this node's last request hears one
      // during its wait and starts together too, instead of waiting for a welcome until this
      // node's start drops it as silent (a ring timeout; seen in the soak's twin kill).
      for (Ring* ring : shared) askToJoin(context, *ring);
      break;
    }
    auto m = context.mailbox.receive(
        [&shared](const Message& x) {
          return x.kind == MessageKind::kCollective && ringOfTag(shared, x.tag) != nullptr;
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(std::min(deadline, next_ask) - now));
    if (!m) continue;
    Ring* ring = ringOfTag(shared, m->tag);
    std::string why;
    if (!isWelcome(*m) && decodeJoinRequest(*m, &why)) heard.insert(m->sender);
    takeJoinAnswer(context, *ring, progress, *m);
  }
  return finishJoining(context, shared, progress, wait);
}

// Drains this ring's join requests from the mailbox. Requests from members of the view are kept
// (a member that restarted before it was found lost): they count once it has been dropped.
void collectJoinRequests(RingContext& context, Ring& ring) {
  const std::string tag = ringControlTag(ring.spec.id);
  auto match = [&tag](const Message& x) {
    return x.kind == MessageKind::kCollective && x.tag == tag && !isWelcome(x);
  };
  for (int i = 0; i < 1024; ++i) {
    auto m = context.mailbox.receive(match, std::chrono::milliseconds(0));
    if (!m) break;
    noteJoinRequest(context, ring, *m);
  }
}

void awaitJoinRequests(RingContext& context, const std::vector<Ring*>& rings,
                       Clock::time_point deadline, const std::set<int64_t>* clusters) {
  auto missing = [&rings, clusters] {
    std::vector<std::string> names;
    for (Ring* ring : rings)
      for (size_t i = 0; i < ring->spec.members.size(); ++i) {
        const std::string& name = ring->spec.members[i].name;
        if ((!clusters || clusters->count(int64_t(i))) &&
            std::find(ring->view.begin(), ring->view.end(), name) == ring->view.end() &&
            !ring->join_requests.count(name))
          names.push_back(name);
      }
    return names;
  };
  for (Ring* ring : rings) collectJoinRequests(context, *ring);
  bool told = false;
  std::optional<Clock::time_point> stop_seen;
  while (!missing().empty()) {
    checkStop(context, &stop_seen, "for the joiners' requests");
    const auto now = Clock::now();
    if (now >= deadline) {
      CAIRN_WARN("cross-cluster sync: no join request from ", joinedNames(missing()),
                 " in time; they are admitted at a later sync once they ask");
      return;
    }
    if (!told) {
      CAIRN_INFO("cross-cluster sync: waiting for ", joinedNames(missing()), " to ask to join");
      told = true;
    }
    auto m = context.mailbox.receive(
        [&rings](const Message& x) {
          if (x.kind != MessageKind::kCollective || isWelcome(x)) return false;
          for (Ring* ring : rings)
            if (x.tag == ringControlTag(ring->spec.id)) return true;
          return false;
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(std::min(deadline, now + kStopPoll) - now));
    if (!m) continue;
    for (Ring* ring : rings)
      if (m->tag == ringControlTag(ring->spec.id)) noteJoinRequest(context, *ring, *m);
  }
}

// After a committed sync: the lowest-ranked member of the view welcomes the joiners; every member
// moves to the next generation with them.
void admit(RingContext& context, Ring& ring, const std::vector<std::string>& joiners) {
  std::vector<std::string> next;
  for (const auto& m : ring.spec.members)
    if (std::find(ring.view.begin(), ring.view.end(), m.name) != ring.view.end() ||
        std::find(joiners.begin(), joiners.end(), m.name) != joiners.end())
      next.push_back(m.name);
  const int64_t generation = ring.generation + 1;
  if (ring.view.front() == context.node.name) {
    Welcome welcome{context.node.name,        ring.spec.id,      generation,      next,
                    context.last_synced_step, ring.transactions, ring.checksum(),
                    welcomeTensors(ring, false)};
    const uint64_t sum = welcome.checksum;
    sendWelcome(context, ring, joiners, encode(welcome));
    context.countStats([&](RingClusterSyncStats& s) { s.last_welcome_checksum = sum; });
    CAIRN_INFO("ring ", ring.spec.id, ": admitted ", joinedNames(joiners), " at step ",
               context.last_synced_step, ", generation ", generation, ", view ", joinedNames(next),
               "; sent weights checksum ", sum);
  } else {
    CAIRN_INFO("ring ", ring.spec.id, ": ", joinedNames(joiners), " admitted by ",
               ring.view.front(), ", generation ", generation, ", view ", joinedNames(next));
  }
  for (const auto& j : joiners) ring.join_requests.erase(j);
  context.countStats([&](RingClusterSyncStats& s) { s.members_joined += int64_t(joiners.size()); });
  ring.alone_logged = false;
  regroup(context, ring, next, generation);
}

}  // namespace cairn
