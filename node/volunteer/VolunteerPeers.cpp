#include "node/volunteer/VolunteerPeers.h"

#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/NodeData.h"
#include "node/volunteer/VolunteerAssignment.h"
#include "trainer/DealSampler.h"

namespace cairn {
namespace {

// "node_1 now at 127.0.0.1:5005" for every peer whose address or key differs.
std::string changes(const NodeSpec& before, const NodeSpec& after) {
  std::map<std::string, PeerRef> old;
  auto collect = [](const NodeSpec& n, auto&& f) {
    if (n.upstream) f(*n.upstream);
    if (n.downstream) f(*n.downstream);
    for (const RingSpec& r : n.rings)
      for (const PeerRef& m : r.members) f(m);
  };
  collect(before, [&](const PeerRef& p) { old[p.name] = p; });
  std::map<std::string, std::string> moved;
  collect(after, [&](const PeerRef& p) {
    auto it = old.find(p.name);
    if (it == old.end() || it->second.address != p.address || it->second.public_key != p.public_key)
      moved[p.name] = p.name + " now at " + p.address;
  });
  std::string out;
  for (const auto& [name, text] : moved) out += (out.empty() ? "" : ", ") + text;
  return out.empty() ? "no peer changed" : out;
}

// The Root that takes an offered deal writes it into its node.json as the deal in force
// (ProviderRun recordTakingDeals); an update the coordinator wrote before it heard every Root
// take it still offers it (extra.offered_deal) over the old extra.deal. Written as it came, the
// update would undo the take, and a run started after it (a Root stopped while paused to take the
// update) planned with the old deal: the 24-volunteer soak retrained steps under it, on samples
// another cluster trained. The deal taken stays in force.
void keepDealTaken(const NodeSpec& current, NodeSpec* next) {
  const nlohmann::json& now = current.extra;
  nlohmann::json& updated = next->extra;
  if (!now.is_object() || !now.contains("deal") || !updated.is_object() ||
      !updated.contains("offered_deal") || updated["offered_deal"] != now["deal"])
    return;
  putDealInForce(updated, now["deal"]);
  CAIRN_INFO("the coordinator's update still offers the deal this node took; it stays in force");
}

}  // namespace

VolunteerPeers::VolunteerPeers(std::string node_data, std::string name, std::string own_public_key,
                               std::string coordinator)
    : node_data_(std::move(node_data)),
      name_(std::move(name)),
      own_public_key_(std::move(own_public_key)),
      coordinator_(std::move(coordinator)) {}

void VolunteerPeers::offer(const PeersUpdate& update) {
  const std::string path = nodeSpecPath(node_data_, name_);
  std::lock_guard<std::mutex> lock(mutex_);
  NodeSpec current, next;
  try {
    current = readNodeSpec(path);
    next = checkPeersUpdate(update, current, own_public_key_, coordinator_);
    keepDealTaken(current, &next);
  } catch (const BadInput& e) {
    CAIRN_WARN("ignored the coordinator's peers update: ", e.what());
    return;
  }
  // The coordinator sends an update at once on this volunteer's heartbeat connection and again in
  // answer to its next heartbeat (coordinator/MemberReplacer.h): the repeat, identical to what this
  // node already wrote or already holds, changes nothing.
  if (toJson(next) == toJson(current) || (update_ && update_->node == update.node)) {
    CAIRN_DEBUG("the coordinator's peers update repeats one this node has; nothing to do");
    return;
  }
  auto same = [](const std::optional<PeerRef>& a, const std::optional<PeerRef>& b) {
    return a.has_value() == b.has_value() &&
           (!a || (a->address == b->address && a->public_key == b->public_key));
  };
  const bool neighbours = !same(current.upstream, next.upstream) || !same(current.downstream, next.downstream);
  if (!neighbours && live_) {
    std::vector<std::string> moved;
    try {
      moved = live_(next);
    } catch (const BadInput& e) {
      // E.g. ring members changed other than by appending (node/ring/RingClusterSync.h addMembers):
      // the update is not used, the node keeps training with the peers it has.
      CAIRN_WARN("ignored the coordinator's peers update: ", e.what());
      return;
    }
    writeJsonFile(path, toJson(next));
    std::string text;
    for (const std::string& m : moved) text += (text.empty() ? "" : ", ") + m;
    CAIRN_INFO("ring peers re-pointed live (", text.empty() ? "none of them was connected" : text,
               "); ", path, " updated");
    return;
  }
  update_ = update;
  replaced_.clear();
  auto note = [&](const std::optional<PeerRef>& before, const std::optional<PeerRef>& after) {
    if (before && !same(before, after)) replaced_.insert(before->name);
  };
  note(current.upstream, next.upstream);
  note(current.downstream, next.downstream);
  has_pending_ = true;
  CAIRN_INFO("the coordinator sent updated peers (a peer was replaced); ",
             not_training_.load() ? "this node (paused, or not training yet) restarts its stage with them"
                            : "the wait on the replaced neighbour ends: the cluster pauses and this "
                              "node restarts its stage with them");
}

std::function<bool(const std::string&)> VolunteerPeers::replacedHook() {
  return [this](const std::string& neighbour) {
    if (!has_pending_.load()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return replaced_.count(neighbour) > 0;
  };
}

std::function<void(LivePeersApply)> VolunteerPeers::liveHook() {
  return [this](LivePeersApply apply) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_ = std::move(apply);
  };
}

std::function<void(const nlohmann::json&)> VolunteerPeers::watch(
    std::function<void(const nlohmann::json&)> inner) {
  return [this, inner = std::move(inner)](const nlohmann::json& event) {
    if (event.is_object() && event.contains("state") && event["state"].is_string()) {
      const std::string state = event["state"].get<std::string>();
      if (state == "paused") not_training_ = true;
      if (state == "resumed") not_training_ = false;
    }
    if (event.is_object() && event.contains("plan")) not_training_ = false;  // training has started
    if (inner) inner(event);
  };
}

std::function<bool()> VolunteerPeers::stopWhenReplaced(std::function<bool()> signal) {
  return [this, signal = std::move(signal)] {
    if (signal && signal()) return true;
    return has_pending_.load() && not_training_.load();
  };
}

bool VolunteerPeers::applyPending() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<PeersUpdate> update;
  update.swap(update_);
  replaced_.clear();
  has_pending_ = false;
  not_training_ = true;  // the next run starts by connecting
  if (!update) return false;
  const std::string path = nodeSpecPath(node_data_, name_);
  try {
    const NodeSpec current = readNodeSpec(path);
    NodeSpec next = checkPeersUpdate(*update, current, own_public_key_, coordinator_);
    keepDealTaken(current, &next);
    writeJsonFile(path, toJson(next));
    CAIRN_INFO("peers updated in ", path, " (", changes(current, next),
               "); running the stage again from the cluster's newest common checkpoint");
    return true;
  } catch (const BadInput& e) {
    CAIRN_WARN("ignored the coordinator's peers update: ", e.what());
    return false;
  }
}

}  // namespace cairn
