// Grower: the coordinator carrying out Growth.h's decisions while the run trains
// (`clusterize --serve … --grow`; docs/OPERATIONS.md "Growing"). Two phases, so that no outcome
// depends on timing:
//   propose  poll(), once spares can hold one more pipeline of the existing cut (chooseGrowth,
//            keeping --keep-spares for replacements; at most --max-clusters): the grown deal
//            (grownDeal: from the epoch after the newest any Root has reported), the new
//            cluster's node.json files (planGrowth) written into <out>/nodes/ with extra.deal,
//            every existing node.json with the new ring members appended and extra.offered_deal
//            (extra.deal stays the deal in force until the Roots took the new one), the
//            spares marked assigned (no replacement takes them), and every existing member owed
//            a `peers` update (sent on its next heartbeat, as MemberReplacer does).
//   answer   each running cluster's Root decides at a step boundary (trainer/DealChange.h; Roots
//            that share rings decide together, at the same step, so alike) and
//            reports {"deal": {"accepted", "epoch", …}} in its metrics stream (observe()):
//            accepted by every Root → the spares get their assignments (stage, node.json, job),
//            join "placed", num_clusters and the deal are saved, the existing node.json files
//            get it as extra.deal (offered_deal gone) and their nodes are owed that update;
//            refused because the Root was
//            already in the deal's epoch → dealt again, the k-th time from 2^k epochs after the
//            newest reported (at most the run's last epoch), and the updates owed again; refused
//            for another reason (e.g. data.chunks below the
//            number of clusters) → growth is abandoned for this run (logged; the spares wait;
//            the existing node.json files lose the newcomers and offered_deal, and their nodes
//            are owed that update).
// State in coordinator.db meta: "growth" (the proposal in flight), "growth_peers_pending", and
// "deal" (Growth.h saveDeal) once a cluster was added. Served data (data.source "coordinator"):
// the coordinator's ChunkServer follows the proposal's deal from the moment "growth" is written,
// before any update is sent (Growth.h servedDeals), so a Root that takes it can fetch at once.
// Ownership: borrows the store; sends through the coordinator's `send`.
// Thread-safety: the coordinator's loop thread only.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/CoordinatorStore.h"
#include "core/NodeData.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

struct GrowOptions {
  bool enabled = false;  // --grow
  int max_clusters = 0;  // --max-clusters (0: no limit)
  int keep_spares = 0;   // --keep-spares: spares growth leaves waiting for replacements
  // Whether a spare is heard lately (MemberReplacer::heardLately); one that is not (dead, frozen,
  // cut off) joins no new cluster. Empty: every spare is.
  std::function<bool(const Member&)> heard_lately;
  // The relays links between dial-out-only volunteers may use (VolunteerRelays::forPlanning).
  // Without one, a new cluster takes a dial-out-only spare only where none of its links joins two
  // dial-out-only volunteers (Growth.h needsRelay); empty: none.
  std::function<std::vector<PeerRef::Relay>()> relays;
};

class Grower {
 public:
  using Send = std::function<void(const std::string& public_key, const Frames& frames)>;
  Grower(CoordinatorStore& store, std::string out, GrowOptions options, Send send);

  // Every loop turn while the run is planned (at most one proposal in flight). Returns the nodes
  // assigned by this call (a cluster whose deal every Root accepted), for the view.
  std::vector<NodeSpec> poll(double now);
  // A member's metrics records: step records give the newest epoch; a Root's "deal" record answers.
  void observe(const std::string& name, const std::vector<nlohmann::json>& records);
  // A member owed a peers update gets it on the connection its heartbeat came from.
  void onHeartbeat(const std::string& name);

 private:
  void propose(double now);
  std::vector<NodeSpec> assign();
  void addToPlan(const std::vector<NodeSpec>& added, int cluster);
  void redeal(int64_t reported_epoch);
  void abandon(const std::string& why);
  // Writes the proposal's deal into its node.json files (offered to the told nodes, in force for
  // the new cluster) and owes every told node its update.
  void writeDeal(const nlohmann::json& growth);
  // Reads, edits and writes back OUT/nodes/<name>/node.json of each of `nodes`.
  void editNodes(const std::vector<std::string>& nodes, const std::function<void(NodeSpec&)>& edit);
  // Every node the proposal `growth` told is owed its node.json as a peers update (onHeartbeat).
  void oweUpdates(const nlohmann::json& growth);
  nlohmann::json growth() const;  // the proposal in flight (null when none)
  void setGrowth(const nlohmann::json& growth);

  CoordinatorStore& store_;
  std::string out_;
  GrowOptions options_;
  Send send_;
  int64_t newest_epoch_ = -1;  // the newest epoch any member's step records named
  double last_poll_ = 0;
  bool told_no_epochs_ = false;
};

}  // namespace cairn::coordinator
