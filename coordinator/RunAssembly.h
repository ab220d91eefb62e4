// RunAssembly: the coordinator's two file-level jobs around training.
//   planVolunteers  spares → node configs → the existing planner (clusterize's planNodes) with the
//                   volunteers' own public keys → node_data/ in the coordinator's out folder
//                   (no secret keys: volunteers made their own) and one Assignment per placed node
//   finishRun       every placed node's trained stage received → the existing merge
//                   (ModelMerge) into <out>/trained.pt and trained.safetensors, the Leaves' final
//                   evaluations, <out>/run_result.json
// Thread-safety: plain functions of files; planVolunteers runs on Gathering's planning thread
// (Gathering.h), finishRun on the coordinator's.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clusterize/Clusterize.h"
#include "coordinator/CoordinatorStore.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

struct PlannedRun {
  std::vector<Assignment> assignments;  // one per placed volunteer
  std::vector<std::string> unplaced;    // volunteers left as spares
  int num_clusters = 0;
  std::string report;                   // clusterize's human-readable plan
  size_t relayed_links = 0;             // links between two dial-out-only volunteers, relayed
};

// Throws BadInput with the planner's reason when these volunteers cannot hold the model. `relays`:
// the relays offered (the coordinator's own with --relay): a link between two dial-out-only
// volunteers that no swap avoids goes through one (DialOutPlacement.h); none: such a plan fails.
PlannedRun planVolunteers(const clusterize::PreparedModel& prepared,
                          const std::vector<Member>& volunteers, const std::string& out,
                          const std::vector<PeerRef::Relay>& relays = {});

// The node configs the planner sees for `volunteers` (id = the number in node_<n>): RAM, bandwidth,
// GFLOPS and GPUs from each one's join probe.
std::vector<NodeConfig> volunteerConfigs(const std::vector<Member>& volunteers);

struct FinishedRun {
  nlohmann::json summary;   // what run_result.json holds
  std::string lines;        // human-readable: one line per cluster's final evaluation + files,
                            // one per volunteer's credit
};
// `credit`: coordinator/Credit.h creditJson, kept in run_result.json as "credit".
FinishedRun finishRun(const std::string& out, const std::vector<StoredResult>& results,
                      const nlohmann::json& credit = nlohmann::json::array());

// The whole file as bytes (a stage.pt or checkpoint sent to a volunteer); InternalError naming the
// file when it cannot be read (the coordinator wrote it itself).
std::string readFileBytes(const std::string& path);

}  // namespace cairn::coordinator
