// Growth: the coordinator's pure decision whether the waiting spares can hold one more whole
// pipeline (issue [J] "Growing"; docs/OPERATIONS.md "Growing"). No store, no sockets, no clock.
//   chooseGrowth  which spare holds each stage of the new cluster, or nothing
//   grownDeal     the deal after one more cluster forms: from the epoch after the newest epoch
//                 any cluster has reported, one more cluster
//   planGrowth    the new cluster's node.json files (copies of cluster 0's, one per stage) and
//                 every existing node.json with the new member appended to its rings
//   loadDeal/saveDeal  the deal table kept in coordinator.db (meta key "deal", JSON
//                 [{"from_epoch":E,"clusters":n},…]; absent: one entry {0, planned clusters}),
//                 validated on load with errors naming deal[i].<field>
// Rule: a stage needs a spare whose probe reports at least `stage_ram_gb[s]` GB (the RAM the plan
// placed that stage on — the same rule as replacement), every stage a different spare, and after
// taking them at least `keep_spares` spares must still wait (spares meant to replace lost members
// are never consumed by growth). Stages are filled in order of decreasing need, each with the
// earliest-joined qualifying spare (members() order): any spare that can hold a stage can hold
// every stage needing less, so this finds a pipeline whenever one exists.
// Carried out by coordinator/Grower.h (`clusterize --serve --grow`).
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "core/NodeData.h"
#include "trainer/DealSampler.h"

namespace cairn::coordinator {

// The RAM (GB) a member's probe reports; 0 when it has none.
double probedRamGb(const Member& m);

// The spare for each stage (index = stage), or nullopt when the spares cannot hold a pipeline and
// still leave `keep_spares` waiting.
std::optional<std::vector<Member>> chooseGrowth(const std::vector<Member>& members,
                                                const std::vector<double>& stage_ram_gb,
                                                int keep_spares);

struct GrowthPlan {
  std::vector<NodeSpec> added;  // the new cluster, by stage: named after its spares
  std::vector<NodeSpec> told;   // every existing node whose rings gained a member
};

// `nodes`: every placed node's node.json; `spares[s]` holds stage s of cluster `new_cluster`
// (chooseGrowth's answer). Each new node copies the stage's node.json of the lowest cluster
// (stage file, parameters, boundaries, ring ids and parameters: a ring needs the same
// parameters), takes the spare's name, advertised address and key, the new cluster's pipeline
// neighbours, and ring members = that ring's members followed by itself (rank last). A node of a
// reachable spare listens (whatever its template's holder was: a member its template reached
// through a relay dials it directly); one of a dial-out-only spare is placed dial-out only, named
// so wherever it is named (DialOutPlacement markDialOutOnly), and each of its links to a
// dial-out-only node goes through the relay of `relays` carrying the fewest links
// (relayLinksOfNode; BadInput when there is such a link and no relay: needsRelay says so first).
// Every existing node in a ring of that stage gets the new member appended (its rank unchanged).
// BadInput when some stage has no node in `nodes` or new_cluster is already taken.
GrowthPlan planGrowth(const std::vector<NodeSpec>& nodes, const std::vector<Member>& spares,
                      int new_cluster, const std::vector<PeerRef::Relay>& relays = {});
// Whether the new cluster `spares` would form links between two dial-out-only volunteers (a
// dial-out-only spare next to another in the pipeline, or in a ring with a node placed dial-out
// only), which need a relay.
bool needsRelay(const std::vector<NodeSpec>& nodes, const std::vector<Member>& spares);
// chooseGrowth with the reachable spares before the dial-out-only ones (each kind in members()
// order), so a dial-out-only spare holds a stage only where no reachable one can; nullopt when
// that choice needsRelay against the placed `nodes` and no relay is offered.
std::optional<std::vector<Member>> chooseLinkableGrowth(const std::vector<Member>& members,
                                                        const std::vector<double>& stage_ram_gb,
                                                        int keep_spares, const std::vector<NodeSpec>& nodes,
                                                        bool relays_offered);

// `deal` plus an entry {E, last clusters + 1} with E = max(newest_reported_epoch + 1, 1, the
// last entry's from_epoch + 1): the epoch after the newest any cluster has reported (-1: none yet),
// never epoch 0 and never before an earlier change.
std::vector<DealEntry> grownDeal(const std::vector<DealEntry>& deal, int64_t newest_reported_epoch);

std::string dealJson(const std::vector<DealEntry>& deal);
// The deal in `json` text (coordinator.db): dealFromJson (trainer/DealSampler.h, the same checks
// as node.json's extra.deal) naming `where`: deal[i].<field> when it is not a valid deal.
std::vector<DealEntry> parseDeal(const std::string& json, const std::string& where);
std::vector<DealEntry> loadDeal(const CoordinatorStore& store, int planned_clusters);
void saveDeal(CoordinatorStore& store, const std::vector<DealEntry>& deal);
// The deals served chunks follow (coordinator/ChunkServer.h): the run's (loadDeal with meta
// "num_clusters", the planned number until a cluster is added) and, when a growth was proposed,
// its deal whatever became of it (meta "growth": a Root may have taken an offer that was dealt
// again or abandoned since). All from coordinator.db, so a restarted coordinator serves the same.
std::vector<std::vector<DealEntry>> servedDeals(const CoordinatorStore& store);
// The nodes of a growth proposed but not formed yet (meta "growth" state "proposed": its spares'
// node names): their node.json files are written and not placed, so a replacement meanwhile must
// re-point them too (MemberReplacer), or the new cluster starts with the lost volunteer's address
// and key (the 24-volunteer soak: the newcomer refused its replaced ring peer's connection).
std::vector<std::string> proposedGrowthNodes(const CoordinatorStore& store);

}  // namespace cairn::coordinator
