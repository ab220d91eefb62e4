// Issue [R]: a planned boundary tensor is checked by its batch dimension (BoundaryValue::batch_dim)
// — that dimension within 1..max rows, the others as planned — and a tensor without one (positions
// from torch.arange(T), an attention mask) exactly as planned. Before, every tensor's first
// dimension was taken for the micro-batch: the Leaf dropped the arange positions ("shape").
#include <gtest/gtest.h>

#include "trainer/Int8Boundary.h"
#include "node/pipeline/StageLinkValidation.h"

namespace cairn {
namespace {

BoundaryValue tensorValue(std::string name, std::string dtype, std::vector<int64_t> shape,
                          std::optional<int64_t> batch_dim) {
  BoundaryValue v{std::move(name), "tensor", std::move(dtype), std::move(shape)};
  v.batch_dim = batch_dim;
  return v;
}

// A Leaf whose inputs are the positions [16] (no batch dimension), a position embedding
// [16, 32] (none), the transposed tokens [16, 8, 32] (dimension 1) and the activations
// [8, 16, 32] (dimension 0), planned at 8 samples per micro-batch.
NodeSpec leafSpec() {
  NodeSpec n;
  n.name = "leaf";
  n.job_id = "job";
  n.stage = 1;
  n.num_stages = 2;
  n.role = StageRole::kLeaf;
  n.upstream = PeerRef{"root", "127.0.0.1:2", ""};
  n.inputs = {tensorValue("positions", "int64", {16}, std::nullopt),
              tensorValue("pe", "float32", {16, 32}, std::nullopt),
              tensorValue("xt", "float32", {16, 8, 32}, 1),
              tensorValue("x", "float32", {8, 16, 32}, 0)};
  return n;
}

Message activation(int64_t rows, int64_t positions = 16) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.job_id = "job";
  m.sender = "root";
  m.tensors.push_back({"positions", torch::arange(positions)});
  m.tensors.push_back({"pe", torch::ones({16, 32})});
  m.tensors.push_back({"xt", torch::ones({16, rows, 32})});
  m.tensors.push_back({"x", torch::ones({rows, 16, 32})});
  return m;
}

std::string verdict(const Message& m, const LinkChecks& checks, std::string* detail = nullptr) {
  const NodeSpec node = leafSpec();
  const PipelineExpectations expected{node, checks, uint64_t(1) << 30};
  return rejectPipelineMessage(m, expected, 0, true, detail).value_or("");
}

TEST(BatchDimValidation, BatchFreeTensorsPassAtAnyMicrobatchSize) {
  LinkChecks checks;
  checks.max_microbatch_rows = 8;
  for (int64_t rows : {1, 3, 8}) EXPECT_EQ(verdict(activation(rows), checks), "") << rows;
  // The batch dimension is bounded: 9 samples in dimension 1 of xt and dimension 0 of x.
  std::string detail;
  EXPECT_EQ(verdict(activation(9), checks, &detail), "shape");
  EXPECT_NE(detail.find("dimension 1 (the batch) 1..8"), std::string::npos) << detail;
}

TEST(BatchDimValidation, BatchFreeTensorMustHaveItsPlannedShape) {
  LinkChecks checks;
  checks.max_microbatch_rows = 32;
  std::string detail;
  // Positions of another length: no dimension of a batch-free tensor may differ from the plan.
  EXPECT_EQ(verdict(activation(4, 8), checks, &detail), "shape");
  EXPECT_NE(detail.find("exactly (no batch dimension)"), std::string::npos) << detail;
  // Format 1's reading (batch_dim 0 for every tensor) is what refused issue [R]'s positions
  // [32] with at most 8 rows.
  NodeSpec old = leafSpec();
  for (BoundaryValue& v : old.inputs) v.batch_dim = 0;
  checks.max_microbatch_rows = 8;
  Message m = activation(4, 16);
  const PipelineExpectations expected{old, checks, uint64_t(1) << 30};
  EXPECT_EQ(rejectPipelineMessage(m, expected, 0, true, &detail).value_or(""), "shape");
  EXPECT_NE(detail.find("\"positions\" has shape [16]"), std::string::npos) << detail;
}

TEST(BatchDimValidation, Int8WireFormFollowsTheBatchDimension) {
  LinkChecks checks;
  checks.max_microbatch_rows = 8;
  checks.wire_float = torch::kChar;
  Message m = activation(3);
  for (NamedTensor& t : m.tensors)
    if (t.tensor.scalar_type() == torch::kFloat) t.tensor = encodeInt8Boundary(t.tensor);
  EXPECT_EQ(verdict(m, checks), "");
  const NodeSpec node = leafSpec();
  EXPECT_EQ(int8PlannedShape(node.inputs[1], m.tensors[1].tensor.sizes()),
            (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(int8PlannedShape(node.inputs[2], m.tensors[2].tensor.sizes()),
            (std::vector<int64_t>{16, 3, 32}));
  EXPECT_EQ(int8PlannedShape(node.inputs[3], m.tensors[3].tensor.sizes()),
            (std::vector<int64_t>{3, 16, 32}));
  // A batch dimension folded into the int8 row (dimension 2 of 3): its size is read off the row.
  const BoundaryValue folded = tensorValue("f", "float32", {2, 5, 4}, 2);
  EXPECT_EQ(int8PlannedShape(folded, int8WireShape({2, 5, 7})), (std::vector<int64_t>{2, 5, 7}));
  EXPECT_FALSE(int8PlannedShape(folded, int8WireShape({3, 5, 7})).has_value());
  // The batch-free embedding at another size is no wire form of its plan.
  EXPECT_FALSE(
      int8PlannedShape(node.inputs[1], encodeInt8Boundary(torch::ones({15, 32})).sizes()));
}

TEST(BatchDimValidation, PlannedBytesCountBatchFreeTensorsOnce) {
  LinkChecks checks;
  checks.max_microbatch_rows = 4;
  const NodeSpec node = leafSpec();
  // positions 16*8 + pe 16*32*4 + xt 16*4*32*4 + x 4*16*32*4, plus 1 MiB for bookkeeping.
  EXPECT_EQ(plannedMessageBytes(node, checks),
            uint64_t(16 * 8 + 16 * 32 * 4 + 2 * 16 * 4 * 32 * 4) + (1u << 20));
}

}  // namespace
}  // namespace cairn
