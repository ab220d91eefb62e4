// NodeDataWriter: writes a clusterize result into a node_data folder:
//   plan.json (with "libtorch": the version of the libtorch that saved the stage files, which a
//   coordinator compares joining volunteers' with), job.json, nodes/node_<id>/node.json,
//   nodes/node_<id>/stage.pt,
//   nodes/node_<id>/secret.key (a fresh CURVE key pair per node, mode 0600; the public keys of a
//   node's neighbours and ring peers are in its node.json, its own in extra.public_key)
// Every file is written to a temporary name and renamed into place. The folder keeps a list of the
// files clusterize wrote (.clusterize-files.json); a re-run replaces those, removes the ones the new
// plan no longer has (and node folders left empty by that), and never touches any other file.
// Not thread-safe; one writer per folder at a time.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "clusterize/PartitionPlan.h"
#include "core/NodeData.h"

namespace cairn::clusterize {

class NodeDataWriter {
 public:
  explicit NodeDataWriter(std::string folder) : folder_(std::move(folder)) {}
  // Keys made elsewhere (volunteers make their own): the nodes' public keys are already in their
  // specs, and no secret.key is written.
  struct KeysGiven {};
  NodeDataWriter(std::string folder, KeysGiven) : folder_(std::move(folder)), generate_keys_(false) {}

  // Returns the paths written, relative to the folder.
  std::vector<std::string> write(const PartitionPlan& plan, const JobSpec& job,
                                 const std::vector<NodeSpec>& nodes,
                                 const std::map<std::string, torch::jit::Module>& stages) const;

  static constexpr const char* kManifest = ".clusterize-files.json";

  // The libtorch version that wrote `folder`'s stage files, from its plan.json "libtorch": nullopt
  // when the folder has no plan.json, "1.13.0" (kUnrecordedLibtorchVersion) for a plan written
  // before the key existed. BadInput naming the file when the plan is unreadable or the value is
  // not a version.
  static std::optional<std::string> stageFilesLibtorch(const std::string& folder);

 private:
  std::string folder_;
  bool generate_keys_ = true;
};

}  // namespace cairn::clusterize
