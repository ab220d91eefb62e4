#include "coordinator/MemberReplacer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "coordinator/Growth.h"
#include "coordinator/Replacement.h"
#include "coordinator/RunAssembly.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/NodeData.h"

namespace cairn::coordinator {
namespace {

std::string joined(const std::vector<NodeSpec>& nodes) {
  std::string out;
  for (const NodeSpec& n : nodes) out += (out.empty() ? "" : ", ") + n.name;
  return out.empty() ? "nobody" : out;
}

}  // namespace

MemberReplacer::MemberReplacer(CoordinatorStore& store, std::string out, double lost_after_s,
                               double started_at, Send send)
    : store_(store),
      out_(std::move(out)),
      lost_after_s_(lost_after_s),
      started_at_(started_at),
      send_(std::move(send)),
      headers_(out_) {}

void MemberReplacer::owePeers(const std::set<std::string>& names) {
  std::set<std::string> owed = pending();
  owed.insert(names.begin(), names.end());
  setPending(owed);
}

std::set<std::string> MemberReplacer::pending() const {
  const auto text = store_.meta("peers_pending");
  if (!text) return {};
  return nlohmann::json::parse(*text).get<std::set<std::string>>();
}

void MemberReplacer::setPending(const std::set<std::string>& names) {
  store_.setMeta("peers_pending", nlohmann::json(names).dump());
}

void MemberReplacer::poll(double now) {
  if (store_.meta("phase").value_or("gathering") != "planned") return;
  const auto placed_text = store_.meta("placed");
  if (!placed_text) return;
  const auto placed = nlohmann::json::parse(*placed_text).get<std::vector<std::string>>();
  std::vector<Member> members = store_.members();
  const std::vector<LostNode> lost_nodes = findLost(members, placed, now, started_at_, lost_after_s_, gone_);
  if (lost_nodes.empty()) return;
  // The relays a dial-out-only spare turning a node's links may use: read once per poll.
  const std::vector<PeerRef::Relay> relays = relays_ ? relays_() : std::vector<PeerRef::Relay>{};
  for (const LostNode& lost : lost_nodes) {
    auto holder = store_.memberByName(lost.name);
    if (!holder) continue;  // no row at all: nothing to take over from (not a state we write)
    if (lost.newly) {
      CAIRN_WARN("coordinator: lost: ", lost.name, " at ", holder->advertise, " (", lost.why, ")");
      store_.setState(lost.name, MemberState::kLost);
      holder->state = MemberState::kLost;
    }
    if (finished_ && finished_(lost.name)) {
      members = store_.members();
      continue;
    }
    const NodeSpec& header = headers_.header(lost.name);
    const double needed = neededGb(header, *holder);
    // A node's peers dial it or wait for it to dial them (node/transport/ReversedLinks.h), as the
    // plan placed it; a spare of its own kind is tried first, then one of the other kind: a
    // reachable volunteer dials out as well, and a dial-out-only one holding a node placed
    // reachable turns its links around (its dial-out-only peers need a relay: canHold).
    const std::optional<Member> spare =
        chooseSpare(sparesFor(withoutAwaySpares(members, now, started_at_, lost_after_s_, gone_),
                              header, !relays.empty()),
                    needed);
    if (!spare) {
      if (told_no_spare_.insert(lost.name).second)
        CAIRN_WARN("coordinator: no spare can take ", lost.name, " over (", lost.why,
                   "); its cluster waits (timeouts.max_wait_s) until a volunteer joins");
      for (const Member& m : members) {  // the spares that cannot take it hear why, once
        if (m.state != MemberState::kSpare || !told_why_not_.insert({m.name, lost.name}).second)
          continue;
        const std::string note = !canHold(m, header, !relays.empty())
                                     ? unlikeReachNote(header)
                                     : tooSmallNote(m, lost.name, needed);
        CAIRN_INFO("coordinator: told ", m.name, ": ", note);
        send_(m.public_key, encode(Accepted{m.name, toString(MemberState::kSpare), note, ""}));
      }
      continue;
    }
    replace(*holder, *spare, now, relays);
    told_no_spare_.erase(lost.name);
    members = store_.members();
  }
}

std::vector<std::string> MemberReplacer::placedNames() const {
  return store_.placedNames();
}

std::string MemberReplacer::spareNote(const Member& spare) const {
  if (store_.meta("phase").value_or("gathering") != "planned") return "";
  return coordinator::spareNote(spare, headers_.headers(placedNames()), relays_ && !relays_().empty());
}

void MemberReplacer::replace(const Member& lost, const Member& spare, double now,
                             const std::vector<PeerRef::Relay>& relays) {
  std::vector<NodeSpec> nodes;  // whole files: every reference to the lost node is re-pointed
  for (const std::string& name : placedNames()) nodes.push_back(readNodeSpec(nodeSpecPath(out_, name)));
  // A proposed growth's nodes are re-pointed too (their holders get the file when the cluster
  // forms, so nothing is owed to them now).
  const std::vector<std::string> growing = proposedGrowthNodes(store_);
  for (const std::string& name : growing) nodes.push_back(readNodeSpec(nodeSpecPath(out_, name)));
  const ReplacementPlan plan = planReplacement(nodes, lost.name, spare.advertise, spare.public_key,
                                               spare.dial_out_only, relays);

  Assignment a;
  a.name = lost.name;
  a.node = toJson(plan.taken_over);
  a.job = toJson(readJobSpec(jobSpecPath(out_)));
  a.num_clusters = plan.taken_over.extra.value("num_clusters", 1);
  a.stage = readFileBytes(nodeDirectory(out_, lost.name) + "/" + plan.taken_over.stage_file);
  const std::optional<StoredCheckpoint> checkpoint = store_.checkpoint(lost.name);
  if (checkpoint) {
    a.checkpoint = readFileBytes(checkpoint->path);
    a.checkpoint_step = checkpoint->step;
  }

  // The plan first (a restarted coordinator reads it), then the rows, then the messages.
  writeJsonFile(nodeSpecPath(out_, lost.name), a.node);
  for (const NodeSpec& n : plan.told) writeJsonFile(nodeSpecPath(out_, n.name), toJson(n));
  store_.takeOver(lost.name, lostRowName(lost.name, store_.members()), spare.name, now);
  std::set<std::string> owed = pending();
  owed.erase(lost.name);  // its new holder gets the whole node.json in the assignment
  for (const NodeSpec& n : plan.told)
    if (std::find(growing.begin(), growing.end(), n.name) == growing.end()) owed.insert(n.name);
  setPending(owed);
  send_(spare.public_key, encode(Accepted{lost.name, toString(MemberState::kAssigned), "", ""}));
  send_(spare.public_key, encode(a));
  ++replaced_;
  if (send_at_once_)
    for (const NodeSpec& n : plan.told) {
      const std::optional<Member> holder = store_.memberByName(n.name);
      if (owed.count(n.name) && holder &&
          send_at_once_(holder->public_key, encode(PeersUpdate{n.name, toJson(n)})))
        CAIRN_DEBUG("coordinator: sent ", n.name, " its updated peers at once (again on its next "
                    "heartbeat)");
    }
  std::string how;
  if (plan.taken_over.dial_out_only && !spare.dial_out_only)
    how = " (dialling out: the node is placed dial-out only)";
  else if (plan.turned)
    how = " (the node was placed reachable: its links turn around, its peers accept its dial" +
          (plan.relayed ? ", " + std::to_string(plan.relayed) + " through a relay" : std::string()) + ")";
  CAIRN_INFO("coordinator: ", lost.name, " is taken over by spare ", spare.name, " at ",
             spare.dial_out_only ? std::string("(dial-out only)") : spare.advertise, how,
             checkpoint ? " from its checkpoint of step " + std::to_string(checkpoint->step)
                                         : std::string(" without a checkpoint (none was uploaded)"),
             "; peers to tell: ", joined(plan.told));
}

void MemberReplacer::onHeartbeat(const Member& member) {
  const std::string& name = member.name;
  // A node marked lost whose own volunteer is heard again before a spare took it over (a frozen
  // laptop woke, a partition healed) holds it again: replacing a live holder would leave two
  // processes training one node (its cluster resumes with the woken one meanwhile). Once taken
  // over, the old holder's row is renamed and its heartbeats claim a name it no longer has.
  if (member.state == MemberState::kLost) {
    store_.setState(name, MemberState::kAssigned);
    told_no_spare_.erase(name);
    CAIRN_INFO("coordinator: ", name, " is heard again before a spare took it over: its volunteer "
               "holds it again (not replaced)");
  }
  std::set<std::string> owed = pending();
  if (!owed.count(name)) return;
  const NodeSpec node = readNodeSpec(nodeSpecPath(out_, name));
  send_(member.public_key, encode(PeersUpdate{name, toJson(node)}));
  owed.erase(name);
  setPending(owed);
  CAIRN_INFO("coordinator: sent ", name, " its updated peers");
}

}  // namespace cairn::coordinator
