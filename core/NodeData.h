// The node_data/ format: the only contract between `clusterize` (writes) and `provider` (reads).
// Every document carries "format": 2 (format 1 is still read) and is validated on load; docs/NODE_DATA.md documents each
// field. Layout:
//   node_data/plan.json                       the whole plan (clusterize's report, for tools)
//   node_data/job.json                        JobSpec: what to train and how (seed 000's shape)
//   node_data/nodes/node_<id>/node.json       NodeSpec: one node's place in the plan
//   node_data/nodes/node_<id>/stage.pt        that node's TorchScript stage
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn {

// Format 2 added BoundaryValue::batch_dim; a format-1 document (no batch_dim) is still read, each
// of its tensors batched along its first dimension (what format 1 meant). Format 3 added
// NodeSpec::shared_parameters; a format-1 or 2 document has none (those plans never split a
// tensor between stages: clusterize refused such cuts).
constexpr int kNodeDataFormat = 3;
constexpr int kOldestNodeDataFormat = 1;

enum class StageRole { kRoot, kStem, kLeaf, kRootLeaf };
std::string toString(StageRole role);
// The role a stage has by position: first is Root, last is Leaf, a single stage is both.
StageRole roleForStage(int stage, int num_stages);

// Another node this node talks to.
struct PeerRef {
  std::string name;     // "node_5"
  std::string address;  // "127.0.0.1:5005"; the peer binds tcp://<address>
  // Z85 CURVE public key (40 chars) when the plan is secured; empty otherwise.
  std::string public_key;
  // node.json "dial_out_only": the peer cannot be dialled (a volunteer behind a home router):
  // it dials us (node/transport/ReversedLinks.h); `address` is empty then.
  bool dial_out_only = false;
  // node.json "relay": the link to this peer goes through a relay (both ends dial-out only:
  // node/transport/RelayedLinks.h): the relay's name, its relay address (host:port) and key.
  struct Relay {
    std::string name;
    std::string address;
    std::string public_key;
    bool operator==(const Relay& o) const {
      return name == o.name && address == o.address && public_key == o.public_key;
    }
  };
  std::optional<Relay> relay = std::nullopt;
};

// One value crossing a stage boundary. Tensors are described by dtype, an example shape and the
// dimension that scales with the micro-batch size (batch_dim; none for a tensor the batch does not
// size, such as positions from torch.arange(T): it crosses whole, its shape exactly as planned);
// non-tensor values (int, float, bool, int_list) travel as small int64/float64 tensors on the wire
// and are converted back on arrival.
struct BoundaryValue {
  std::string name;
  std::string type = "tensor";  // tensor | int | float | bool | int_list
  std::string dtype = "float32";
  std::vector<int64_t> shape;
  // node.json "batch_dim": an index into shape, or null (none). Absent (format 1): 0.
  std::optional<int64_t> batch_dim = 0;
};

// Nodes that hold the same parameters in different clusters and ring-reduce them together.
struct RingSpec {
  std::string id;                       // "ring_0"
  std::vector<std::string> parameters;  // dotted names (parameters and buffers) in this group
  std::vector<PeerRef> members;         // in ring order, this node included
  int rank = 0;                         // this node's position in `members`
};

// A parameter that units in several stages of this node's cluster use (a tied embedding and head):
// each of those stages holds a copy; once per step their gradients are summed over the pipeline
// and every copy gets the total (trainer/SharedParameters.h). Listed on every node from the first
// holder to the last (the nodes between relay the exchange).
struct SharedParameterSpec {
  std::string name;         // the name the first using unit gives it: the exchange's and ring's key
  std::vector<int> stages;  // the stages holding a copy, ascending (two or more)
  // The name of this node's copy inside stage.pt; empty when this node only relays.
  std::string local_name;
};

struct NodeSpec {
  int format = kNodeDataFormat;
  std::string name;     // "node_3"
  std::string job_id;
  std::string address;  // where this node binds: "127.0.0.1:5003"; empty when dial_out_only
  // node.json "dial_out_only": nobody can dial this node; it binds nothing and dials every peer
  // (each of which is reachable: a link between two dial-out-only nodes needs a relay).
  bool dial_out_only = false;
  int cluster = 0;
  int stage = 0;
  int num_stages = 1;
  StageRole role = StageRole::kRootLeaf;
  std::optional<PeerRef> upstream;    // absent for Root
  std::optional<PeerRef> downstream;  // absent for Leaf
  std::vector<BoundaryValue> inputs;  // the stage's forward arguments, in order
  std::vector<BoundaryValue> outputs;  // what it returns, in order
  std::vector<std::string> parameters;  // dotted names as in the original model
  std::vector<std::string> buffers;
  std::vector<RingSpec> rings;
  std::vector<SharedParameterSpec> shared_parameters;  // format 3; empty: none
  std::string stage_file = "stage.pt";  // relative to the node's folder
  double estimated_memory_bytes = 0;
  double estimated_seconds_per_microbatch = 0;
  // Everything else clusterize wants a node to know (kept, not interpreted by core).
  nlohmann::json extra = nlohmann::json::object();
};

// Data section of job.json: { "location": ..., "format": "idx", "chunk": [...] , ... }.
struct DataSpec {
  std::string location;  // folder, file or glob pattern
  std::string format;    // idx | images | safetensors | npy | tokens
  std::vector<int64_t> chunk;  // shard ids for this job (empty: automatic split by cluster)
  nlohmann::json options = nlohmann::json::object();  // format-specific (normalize, block_length…)
};

// job.json, in the shape of seed 000's job definition. `training` is the training_definition
// object; trainer/ validates it into its options struct (one place owns those fields).
struct JobSpec {
  int format = kNodeDataFormat;
  std::string job_id;
  std::string driver = "cairn";
  std::string model;
  DataSpec data;
  nlohmann::json training = nlohmann::json::object();
};

nlohmann::json toJson(const NodeSpec& node);
// One boundary value as node.json and plan.json write it (batch_dim for tensors: index or null).
nlohmann::json boundaryToJson(const BoundaryValue& value);
nlohmann::json toJson(const JobSpec& job);
// Validate and convert; `source` names the file in errors (BadInput).
NodeSpec parseNodeSpec(const nlohmann::json& document, const std::string& source);
JobSpec parseJobSpec(const nlohmann::json& document, const std::string& source);
NodeSpec readNodeSpec(const std::string& path);
JobSpec readJobSpec(const std::string& path);

// Paths inside a node_data folder.
std::string nodeDirectory(const std::string& node_data, const std::string& node_name);
std::string nodeSpecPath(const std::string& node_data, const std::string& node_name);
std::string jobSpecPath(const std::string& node_data);
std::string planPath(const std::string& node_data);

// Names of dtypes accepted in node_data and on the wire.
const std::vector<std::string>& knownDtypeNames();

}  // namespace cairn
