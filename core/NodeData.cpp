#include "core/NodeData.h"

#include <algorithm>
#include <set>

#include "core/JsonReader.h"
#include "core/NodeConfigs.h"

namespace cairn {
namespace {

nlohmann::json peerToJson(const PeerRef& p) {
  nlohmann::json j = {{"name", p.name}, {"address", p.address}};
  if (!p.public_key.empty()) j["public_key"] = p.public_key;
  if (p.dial_out_only) j["dial_out_only"] = true;
  if (p.relay)
    j["relay"] = {{"name", p.relay->name}, {"address", p.relay->address},
                  {"public_key", p.relay->public_key}};
  return j;
}

PeerRef::Relay parseRelay(const JsonReader& r) {
  r.rejectUnknownKeys({"name", "address", "public_key"});
  PeerRef::Relay relay;
  relay.name = r.string("name");
  relay.address = r.string("address");
  std::string host;
  int port = 0;
  parseHostPort(relay.address, r.context(), r.path("address"), &host, &port);
  relay.public_key = r.string("public_key");
  if (relay.public_key.size() != 40)
    r.fail("public_key", "must be the relay's 40-character Z85 CURVE key");
  return relay;
}

PeerRef parsePeer(const JsonReader& r) {
  r.rejectUnknownKeys({"name", "address", "public_key", "dial_out_only", "relay"});
  PeerRef p;
  p.name = r.string("name");
  p.dial_out_only = r.has("dial_out_only") && r.boolean("dial_out_only");
  p.address = p.dial_out_only ? r.stringOr("address", "") : r.string("address");
  std::string host;
  int port = 0;
  if (!p.dial_out_only) parseHostPort(p.address, r.context(), r.path("address"), &host, &port);
  p.public_key = r.stringOr("public_key", "");
  if (!p.public_key.empty() && p.public_key.size() != 40)
    r.fail("public_key", "must be a 40-character Z85 CURVE key");
  if (r.has("relay")) {
    p.relay = parseRelay(r.object("relay"));
    if (!p.dial_out_only)
      r.fail("relay", "is only for a dial-out-only peer (a link between two dial-out-only nodes)");
  }
  return p;
}

BoundaryValue parseBoundary(const JsonReader& r) {
  r.rejectUnknownKeys({"name", "type", "dtype", "shape", "batch_dim"});
  BoundaryValue b;
  b.name = r.string("name");
  b.type = r.choiceOr("type", {"tensor", "int", "float", "bool", "int_list"}, "tensor");
  b.dtype = r.choice("dtype", knownDtypeNames());
  b.shape = r.integerList("shape", 0, int64_t{1} << 40);
  if (b.shape.size() > 16) r.fail("shape", "has more than 16 dimensions");
  // Absent (format 1): the first dimension; null: none.
  const auto batch_dim = r.raw().find("batch_dim");
  if (batch_dim != r.raw().end() && batch_dim->is_null())
    b.batch_dim.reset();
  else if (batch_dim != r.raw().end())
    b.batch_dim = r.integer("batch_dim", 0, std::max<int64_t>(int64_t(b.shape.size()) - 1, 0));
  return b;
}

void checkFormat(const JsonReader& r) {
  const int64_t format = r.integer("format", 0, 1000);
  if (format < kOldestNodeDataFormat || format > kNodeDataFormat)
    r.fail("format", "is " + std::to_string(format) + " but this cairn reads formats " +
                         std::to_string(kOldestNodeDataFormat) + ".." +
                         std::to_string(kNodeDataFormat) + " (re-run clusterize)");
}

}  // namespace

nlohmann::json boundaryToJson(const BoundaryValue& b) {
  nlohmann::json j = {{"name", b.name}, {"type", b.type}, {"dtype", b.dtype}, {"shape", b.shape}};
  if (b.type == "tensor")
    j["batch_dim"] = b.batch_dim ? nlohmann::json(*b.batch_dim) : nlohmann::json(nullptr);
  return j;
}

const std::vector<std::string>& knownDtypeNames() {
  static const std::vector<std::string> names = {"float32", "float16", "bfloat16", "float64",
                                                 "int64",   "int32",   "uint8",    "bool"};
  return names;
}

std::string toString(StageRole role) {
  switch (role) {
    case StageRole::kRoot:
      return "root";
    case StageRole::kStem:
      return "stem";
    case StageRole::kLeaf:
      return "leaf";
    case StageRole::kRootLeaf:
      return "root_leaf";
  }
  return "?";
}

StageRole roleForStage(int stage, int num_stages) {
  if (num_stages == 1) return StageRole::kRootLeaf;
  if (stage == 0) return StageRole::kRoot;
  if (stage == num_stages - 1) return StageRole::kLeaf;
  return StageRole::kStem;
}

nlohmann::json toJson(const NodeSpec& n) {
  nlohmann::json j;
  j["format"] = n.format;
  j["name"] = n.name;
  j["job_id"] = n.job_id;
  j["address"] = n.address;
  if (n.dial_out_only) j["dial_out_only"] = true;
  j["cluster"] = n.cluster;
  j["stage"] = n.stage;
  j["num_stages"] = n.num_stages;
  j["role"] = toString(n.role);
  j["upstream"] = n.upstream ? peerToJson(*n.upstream) : nlohmann::json();
  j["downstream"] = n.downstream ? peerToJson(*n.downstream) : nlohmann::json();
  j["inputs"] = nlohmann::json::array();
  for (const auto& b : n.inputs) j["inputs"].push_back(boundaryToJson(b));
  j["outputs"] = nlohmann::json::array();
  for (const auto& b : n.outputs) j["outputs"].push_back(boundaryToJson(b));
  j["parameters"] = n.parameters;
  j["buffers"] = n.buffers;
  j["rings"] = nlohmann::json::array();
  for (const auto& ring : n.rings) {
    nlohmann::json r = {{"id", ring.id}, {"parameters", ring.parameters}, {"rank", ring.rank}};
    r["members"] = nlohmann::json::array();
    for (const auto& m : ring.members) r["members"].push_back(peerToJson(m));
    j["rings"].push_back(r);
  }
  j["shared_parameters"] = nlohmann::json::array();
  for (const auto& shared : n.shared_parameters)
    j["shared_parameters"].push_back(
        {{"name", shared.name},
         {"stages", shared.stages},
         {"local_name", shared.local_name.empty() ? nlohmann::json(nullptr)
                                                  : nlohmann::json(shared.local_name)}});
  j["stage_file"] = n.stage_file;
  j["estimates"] = {{"memory_bytes", n.estimated_memory_bytes},
                    {"seconds_per_microbatch", n.estimated_seconds_per_microbatch}};
  j["extra"] = n.extra;
  return j;
}

// node.json "shared_parameters": each entry's stages ascending, this node's stage within them or
// between the first and the last, a local_name exactly when this node holds a copy (and listed in
// "parameters", which is what loads and trains it).
void parseSharedParameters(const JsonReader& r, NodeSpec* n) {
  std::set<std::string> names;
  for (const auto& e : r.objectList("shared_parameters")) {
    e.rejectUnknownKeys({"name", "stages", "local_name"});
    SharedParameterSpec shared;
    shared.name = e.string("name");
    if (!names.insert(shared.name).second)
      e.fail("name", "\"" + shared.name + "\" is listed twice in shared_parameters");
    for (int64_t s : e.integerList("stages", 0, n->num_stages - 1))
      shared.stages.push_back(static_cast<int>(s));
    if (shared.stages.size() < 2 ||
        !std::is_sorted(shared.stages.begin(), shared.stages.end()) ||
        std::adjacent_find(shared.stages.begin(), shared.stages.end()) != shared.stages.end())
      e.fail("stages", "must list two or more different stages in ascending order");
    if (n->stage < shared.stages.front() || n->stage > shared.stages.back())
      e.fail("stages", "do not span this node's stage " + std::to_string(n->stage));
    const bool holds =
        std::find(shared.stages.begin(), shared.stages.end(), n->stage) != shared.stages.end();
    if (auto local = e.optionalString("local_name")) shared.local_name = *local;
    if (holds == shared.local_name.empty())
      e.fail("local_name", holds ? "is required: stage " + std::to_string(n->stage) +
                                       " holds a copy of \"" + shared.name + "\""
                                 : "must be null: this node only relays \"" + shared.name + "\"");
    if (holds && std::find(n->parameters.begin(), n->parameters.end(), shared.local_name) ==
                     n->parameters.end())
      e.fail("local_name", "\"" + shared.local_name + "\" is not among this node's parameters");
    n->shared_parameters.push_back(std::move(shared));
  }
}

NodeSpec parseNodeSpec(const nlohmann::json& document, const std::string& source) {
  JsonReader r(document, source);
  r.rejectUnknownKeys({"format", "name", "job_id", "address", "cluster", "stage", "num_stages",
                       "role", "upstream", "downstream", "inputs", "outputs", "parameters",
                       "buffers", "rings", "shared_parameters", "stage_file", "estimates",
                       "extra", "dial_out_only"});
  checkFormat(r);
  NodeSpec n;
  n.name = r.string("name");
  n.job_id = r.string("job_id");
  n.dial_out_only = r.has("dial_out_only") && r.boolean("dial_out_only");
  n.address = n.dial_out_only ? r.stringOr("address", "") : r.string("address");
  std::string host;
  int port = 0;
  if (!n.dial_out_only) parseHostPort(n.address, source, "address", &host, &port);
  n.cluster = static_cast<int>(r.integer("cluster", 0, 1 << 20));
  n.num_stages = static_cast<int>(r.integer("num_stages", 1, 1 << 16));
  n.stage = static_cast<int>(r.integer("stage", 0, n.num_stages - 1));
  const std::string role = r.choice("role", {"root", "stem", "leaf", "root_leaf"});
  n.role = roleForStage(n.stage, n.num_stages);
  if (role != toString(n.role))
    r.fail("role", "is \"" + role + "\" but stage " + std::to_string(n.stage) + " of " +
                       std::to_string(n.num_stages) + " is a " + toString(n.role));
  if (auto up = r.optionalObject("upstream")) n.upstream = parsePeer(*up);
  if (auto down = r.optionalObject("downstream")) n.downstream = parsePeer(*down);
  const bool first = n.stage == 0, last = n.stage == n.num_stages - 1;
  if (first == n.upstream.has_value())
    r.fail("upstream", first ? "must be absent for the first stage" : "is required for this stage");
  if (last == n.downstream.has_value())
    r.fail("downstream", last ? "must be absent for the last stage" : "is required for this stage");
  for (const auto& b : r.objectList("inputs")) n.inputs.push_back(parseBoundary(b));
  for (const auto& b : r.objectList("outputs")) n.outputs.push_back(parseBoundary(b));
  if (n.inputs.empty()) r.fail("inputs", "must list at least one value");
  if (n.outputs.empty()) r.fail("outputs", "must list at least one value");
  n.parameters = r.stringList("parameters");
  n.buffers = r.has("buffers") ? r.stringList("buffers") : std::vector<std::string>{};
  {
    // A tensor listed twice would be loaded, trained and ring-reduced twice.
    std::set<std::string> seen;
    for (const auto* list : {&n.parameters, &n.buffers})
      for (const auto& t : *list)
        if (!seen.insert(t).second)
          r.fail(list == &n.parameters ? "parameters" : "buffers",
                 "names \"" + t + "\" twice (each parameter and buffer must be listed once)");
  }
  if (r.has("rings")) {
    for (const auto& rr : r.objectList("rings")) {
      rr.rejectUnknownKeys({"id", "parameters", "members", "rank"});
      RingSpec ring;
      ring.id = rr.string("id");
      ring.parameters = rr.stringList("parameters");
      for (const auto& m : rr.objectList("members")) ring.members.push_back(parsePeer(m));
      if (ring.members.empty()) rr.fail("members", "must list at least this node");
      ring.rank = static_cast<int>(rr.integer("rank", 0, int64_t(ring.members.size()) - 1));
      if (ring.members[ring.rank].name != n.name)
        rr.fail("rank", "points at " + ring.members[ring.rank].name + ", not at " + n.name);
      n.rings.push_back(std::move(ring));
    }
  }
  if (r.has("shared_parameters")) parseSharedParameters(r, &n);
  n.stage_file = r.stringOr("stage_file", "stage.pt");
  if (n.stage_file.find('/') != std::string::npos || n.stage_file.find("..") != std::string::npos)
    r.fail("stage_file", "must be a file name inside the node's folder");
  if (auto est = r.optionalObject("estimates")) {
    n.estimated_memory_bytes = est->nonNegativeNumberOr("memory_bytes", 0);
    n.estimated_seconds_per_microbatch = est->nonNegativeNumberOr("seconds_per_microbatch", 0);
  }
  if (r.has("extra")) n.extra = r.object("extra").raw();
  return n;
}

nlohmann::json toJson(const JobSpec& job) {
  nlohmann::json data = job.data.options;
  data["location"] = job.data.location;
  data["format"] = job.data.format;
  if (!job.data.chunk.empty()) data["chunk"] = job.data.chunk;
  return {{"format", job.format}, {"job_id", job.job_id},   {"driver", job.driver},
          {"model", job.model},   {"data", data},           {"training_definition", job.training}};
}

JobSpec parseJobSpec(const nlohmann::json& document, const std::string& source) {
  JsonReader r(document, source);
  r.rejectUnknownKeys({"format", "job_id", "driver", "model", "data", "training_definition"});
  checkFormat(r);
  JobSpec job;
  job.job_id = r.string("job_id");
  if (job.job_id.empty() || job.job_id.size() > 128) r.fail("job_id", "must be 1 to 128 characters");
  job.driver = r.stringOr("driver", "cairn");
  job.model = r.stringOr("model", "");
  JsonReader data = r.object("data");
  job.data.location = data.string("location");
  job.data.format = data.choice("format", {"idx", "images", "safetensors", "npy", "tokens"});
  if (data.has("chunk")) job.data.chunk = data.integerList("chunk", 0, 1 << 30);
  job.data.options = data.raw();
  job.data.options.erase("location");
  job.data.options.erase("format");
  job.data.options.erase("chunk");
  job.training = r.object("training_definition").raw();
  return job;
}

NodeSpec readNodeSpec(const std::string& path) { return parseNodeSpec(readJsonFile(path), path); }
JobSpec readJobSpec(const std::string& path) { return parseJobSpec(readJsonFile(path), path); }

std::string nodeDirectory(const std::string& node_data, const std::string& node_name) {
  return node_data + "/nodes/" + node_name;
}
std::string nodeSpecPath(const std::string& node_data, const std::string& node_name) {
  return nodeDirectory(node_data, node_name) + "/node.json";
}
std::string jobSpecPath(const std::string& node_data) { return node_data + "/job.json"; }
std::string planPath(const std::string& node_data) { return node_data + "/plan.json"; }

}  // namespace cairn
