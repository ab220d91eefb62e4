// The profiler finds which dimension of each value crossing a cut scales with the batch (issue
// [R]): gpt_late_pos cut before pos2 is crossed by the arange positions, the position embedding
// and the mask as float and as bool (no batch dimension), the activations (dimension 0) and the
// transposed token embedding (dimension 1); node.json round-trips batch_dim, and a format-1
// boundary without it reads as batched along its first dimension.
#include <gtest/gtest.h>

#include <algorithm>

#include "TestModels.h"
#include "clusterize/ModelGraph.h"
#include "clusterize/Profiler.h"
#include "core/Error.h"

namespace cairn::clusterize {
namespace {

int unitStarting(const ModelGraph& graph, const std::string& prefix) {
  for (int u = 0; u < graph.numUnits(); ++u)
    if (graph.units()[u].label.rfind(prefix, 0) == 0) return u;
  return -1;
}

// batch_dim of each value (-1: none), sorted.
std::vector<int64_t> batchDims(const std::vector<BoundaryValue>& values) {
  std::vector<int64_t> out;
  for (const BoundaryValue& v : values) out.push_back(v.batch_dim ? *v.batch_dim : -1);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(BatchDim, ProfilerFindsEachBoundaryTensorsBatchDimension) {
  ModelGraph graph(torch::jit::load(testing::modelPath("gpt_late_pos")), Granularity::kTop);
  const int before_pos2 = unitStarting(graph, "pos2 ");
  const int before_b2 = unitStarting(graph, "b2 ");
  ASSERT_GT(before_pos2, 0);
  ASSERT_GT(before_b2, before_pos2);
  ASSERT_TRUE(graph.isValidCut(before_pos2)) << graph.whyInvalid(before_pos2);
  const ModelProfile profile =
      profileModel(graph, testing::exampleInputs("gpt_late_pos", 4), ProfileOptions{0, 1});

  const std::vector<BoundaryValue> crossing = profile.describeCut(graph, before_pos2);
  ASSERT_EQ(crossing.size(), 6u);
  int seen = 0;
  for (const BoundaryValue& v : crossing) {
    SCOPED_TRACE(v.name);
    ASSERT_EQ(v.type, "tensor");
    const std::vector<int64_t>& s = v.shape;
    if (v.dtype == "int64") {  // the positions
      EXPECT_EQ(s, (std::vector<int64_t>{10}));
      EXPECT_FALSE(v.batch_dim.has_value());
    } else if (v.dtype == "bool") {  // the mask as bool
      EXPECT_EQ(s, (std::vector<int64_t>{10, 10}));
      EXPECT_FALSE(v.batch_dim.has_value());
    } else if (s == std::vector<int64_t>{10, 10} || s == std::vector<int64_t>{10, 32}) {
      EXPECT_FALSE(v.batch_dim.has_value());  // the mask, the position embedding
    } else if (s == std::vector<int64_t>{10, 4, 32}) {
      EXPECT_EQ(v.batch_dim, std::optional<int64_t>(1));  // transposed
    } else {
      EXPECT_EQ(s, (std::vector<int64_t>{4, 10, 32}));
      EXPECT_EQ(v.batch_dim, std::optional<int64_t>(0));
    }
    ++seen;
  }
  EXPECT_EQ(seen, 6);
  // The model's input (cut 0) is batched along dimension 0; the cut before b2 sees the mask and
  // the activations.
  for (const BoundaryValue& v : profile.describeCut(graph, 0))
    EXPECT_EQ(v.batch_dim, std::optional<int64_t>(0));
  EXPECT_EQ(batchDims(profile.describeCut(graph, before_b2)), (std::vector<int64_t>{-1, 0}));
}

TEST(BatchDim, NodeJsonWritesAndReadsBatchDim) {
  NodeSpec n;
  n.name = "node_1";
  n.job_id = "j";
  n.address = "127.0.0.1:5001";
  n.stage = 1;
  n.num_stages = 2;
  n.role = StageRole::kLeaf;
  n.upstream = PeerRef{"node_0", "127.0.0.1:5000", ""};
  BoundaryValue positions{"positions", "tensor", "int64", {16}};
  positions.batch_dim.reset();
  BoundaryValue transposed{"xt", "tensor", "float32", {16, 8, 32}};
  transposed.batch_dim = 1;
  n.inputs = {positions, transposed, BoundaryValue{"x", "tensor", "float32", {8, 16, 32}}};
  n.outputs = {BoundaryValue{"logits", "tensor", "float32", {8, 16, 50}}};
  nlohmann::json j = toJson(n);
  EXPECT_EQ(j["format"], kNodeDataFormat);
  EXPECT_TRUE(j["inputs"][0]["batch_dim"].is_null());
  EXPECT_EQ(j["inputs"][1]["batch_dim"], 1);
  EXPECT_EQ(j["inputs"][2]["batch_dim"], 0);
  const NodeSpec back = parseNodeSpec(j, "node.json");
  EXPECT_FALSE(back.inputs[0].batch_dim.has_value());
  EXPECT_EQ(back.inputs[1].batch_dim, std::optional<int64_t>(1));
  EXPECT_EQ(back.inputs[2].batch_dim, std::optional<int64_t>(0));
  // Format 1 (no batch_dim): every tensor batched along its first dimension, as it meant then.
  j["format"] = 1;
  for (auto& v : j["inputs"]) v.erase("batch_dim");
  for (const BoundaryValue& v : parseNodeSpec(j, "node.json").inputs)
    EXPECT_EQ(v.batch_dim, std::optional<int64_t>(0));
  // A batch_dim beyond the shape is refused, naming the key.
  j["format"] = 2;
  j["inputs"][0]["batch_dim"] = 1;
  EXPECT_THROW(parseNodeSpec(j, "node.json"), BadInput);
}

}  // namespace
}  // namespace cairn::clusterize
