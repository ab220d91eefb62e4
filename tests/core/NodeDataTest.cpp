#include <gtest/gtest.h>

#include "core/Error.h"
#include "core/NodeData.h"

namespace cairn {
namespace {

NodeSpec exampleStem() {
  NodeSpec n;
  n.name = "node_2";
  n.job_id = "fmnist";
  n.address = "127.0.0.1:5002";
  n.cluster = 1;
  n.stage = 1;
  n.num_stages = 3;
  n.role = StageRole::kStem;
  n.upstream = PeerRef{"node_1", "127.0.0.1:5001", ""};
  n.downstream = PeerRef{"node_3", "127.0.0.1:5003", ""};
  n.inputs = {{"x", "tensor", "float32", {64, 8, 14, 14}}, {"n", "int", "int64", {}}};
  n.outputs = {{"h", "tensor", "float32", {64, 128}}};
  n.parameters = {"conv2.weight", "conv2.bias"};
  n.buffers = {"bn.running_mean"};
  RingSpec ring;
  ring.id = "ring_1";
  ring.parameters = {"conv2.weight"};
  ring.members = {{"node_2", "127.0.0.1:5002", ""}, {"node_7", "127.0.0.1:5007", ""}};
  ring.rank = 0;
  n.rings = {ring};
  // A tied embedding and head held by stages 0 and 2: this Stem relays their exchange.
  n.shared_parameters = {{"emb.weight", {0, 2}, ""}};
  n.estimated_memory_bytes = 1234;
  return n;
}

TEST(NodeData, NodeSpecRoundTripsThroughJson) {
  const NodeSpec n = exampleStem();
  const NodeSpec back = parseNodeSpec(toJson(n), "node.json");
  EXPECT_EQ(toJson(back), toJson(n));
  EXPECT_EQ(back.role, StageRole::kStem);
  EXPECT_EQ(back.upstream->name, "node_1");
  EXPECT_EQ(back.inputs[1].type, "int");
  EXPECT_EQ(back.rings[0].members[1].name, "node_7");
  ASSERT_EQ(back.shared_parameters.size(), 1u);
  EXPECT_EQ(back.shared_parameters[0].stages, (std::vector<int>{0, 2}));
  EXPECT_TRUE(back.shared_parameters[0].local_name.empty());
  // A format-2 document has no shared_parameters: none.
  nlohmann::json old = toJson(n);
  old["format"] = 2;
  old.erase("shared_parameters");
  EXPECT_TRUE(parseNodeSpec(old, "node.json").shared_parameters.empty());
}

struct BrokenNode {
  const char* label;
  std::function<void(nlohmann::json&)> damage;
  const char* expected;
};

class BrokenNodeSpec : public ::testing::TestWithParam<BrokenNode> {};

TEST_P(BrokenNodeSpec, Rejected) {
  nlohmann::json j = toJson(exampleStem());
  GetParam().damage(j);
  try {
    parseNodeSpec(j, "node.json");
    FAIL() << "accepted " << j.dump();
  } catch (const BadInput& e) {
    EXPECT_EQ(std::string(e.what()), GetParam().expected);
  }
}

const BrokenNode kBroken[] = {
    {"future_format", [](nlohmann::json& j) { j["format"] = 4; },
     "node.json: format is 4 but this cairn reads formats 1..3 (re-run clusterize)"},
    {"shared_relay_with_copy",
     [](nlohmann::json& j) { j["shared_parameters"][0]["local_name"] = "conv2.weight"; },
     "node.json: shared_parameters[0].local_name must be null: this node only relays \"emb.weight\""},
    {"shared_holder_without_copy",
     [](nlohmann::json& j) { j["shared_parameters"][0]["stages"] = {1, 2}; },
     "node.json: shared_parameters[0].local_name is required: stage 1 holds a copy of \"emb.weight\""},
    {"shared_copy_not_a_parameter",
     [](nlohmann::json& j) {
       j["shared_parameters"][0]["stages"] = {0, 1};
       j["shared_parameters"][0]["local_name"] = "emb.weight";
     },
     "node.json: shared_parameters[0].local_name \"emb.weight\" is not among this node's parameters"},
    {"shared_one_stage", [](nlohmann::json& j) { j["shared_parameters"][0]["stages"] = {2, 2}; },
     "node.json: shared_parameters[0].stages must list two or more different stages in ascending order"},
    {"role_mismatch", [](nlohmann::json& j) { j["role"] = "leaf"; },
     "node.json: role is \"leaf\" but stage 1 of 3 is a stem"},
    {"stage_out_of_range", [](nlohmann::json& j) { j["stage"] = 3; },
     "node.json: stage must be between 0 and 2 (got 3)"},
    {"missing_upstream", [](nlohmann::json& j) { j.erase("upstream"); },
     "node.json: upstream is required for this stage"},
    {"unknown_dtype", [](nlohmann::json& j) { j["inputs"][0]["dtype"] = "complex64"; },
     "node.json: inputs[0].dtype must be one of float32, float16, bfloat16, float64, int64, int32, "
     "uint8, bool (got \"complex64\")"},
    {"bad_peer_address", [](nlohmann::json& j) { j["downstream"]["address"] = "nowhere"; },
     "node.json: downstream.address must be host:port, e.g. \"127.0.0.1:5000\" (got \"nowhere\")"},
    {"ring_rank_elsewhere", [](nlohmann::json& j) { j["rings"][0]["rank"] = 1; },
     "node.json: rings[0].rank points at node_7, not at node_2"},
    {"stage_file_escapes", [](nlohmann::json& j) { j["stage_file"] = "../other/stage.pt"; },
     "node.json: stage_file must be a file name inside the node's folder"},
};

INSTANTIATE_TEST_SUITE_P(Table, BrokenNodeSpec, ::testing::ValuesIn(kBroken),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(NodeData, JobSpecFollowsSeedShape) {
  const auto doc = nlohmann::json::parse(R"({
    "format": 1, "job_id": "fmnist", "driver": "cairn", "model": "model.pt",
    "data": {"location": "/usr/share/datasets/fashion-mnist", "format": "idx", "chunk": [0, 1],
             "normalize": {"mean": [0.286], "std": [0.353]}},
    "training_definition": {"loss_fn": "cross_entropy", "local_steps": 10}
  })");
  const JobSpec job = parseJobSpec(doc, "job.json");
  EXPECT_EQ(job.data.format, "idx");
  EXPECT_EQ(job.data.chunk, (std::vector<int64_t>{0, 1}));
  EXPECT_TRUE(job.data.options.contains("normalize"));
  EXPECT_EQ(job.training["loss_fn"], "cross_entropy");
  EXPECT_EQ(toJson(parseJobSpec(toJson(job), "job.json")), toJson(job));
}

TEST(NodeData, JobSpecRejectsUnknownDataFormat) {
  const auto doc = nlohmann::json::parse(R"({"format": 1, "job_id": "j",
    "data": {"location": "x", "format": "csv"}, "training_definition": {}})");
  try {
    parseJobSpec(doc, "job.json");
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_EQ(std::string(e.what()),
              "job.json: data.format must be one of idx, images, safetensors, npy, tokens (got "
              "\"csv\")");
  }
}

}  // namespace
}  // namespace cairn
