// A test hook, off unless the environment asks for it (issue [Q], silent corruption):
// CAIRN_TEST_FLIP_BIT=CLUSTER:STAGE:STEP:TENSOR:INDEX:BIT:FILE makes the node of stage STAGE of
// cluster CLUSTER flip bit BIT (0..31) of float element INDEX of its parameter TENSOR right after
// the optimizer step that makes STEP steps done, before the cross-cluster sync, once: only while
// FILE does not exist, which it then creates (a spare that resumes that node from an earlier step
// does not flip it again). tests/integration/volunteer_churn_test.py bit_flip uses it to check that
// the ring drops the corrupt copy before it is averaged (node/ring/RingSyncMath.h).
// A malformed value, or a TENSOR the stage does not hold, is a BadInput naming the variable.
#pragma once

#include <torch/script.h>

#include <cstdint>

namespace cairn {

void testFlipBit(torch::jit::Module& stage, int cluster, int stage_index, int64_t steps_done);
// Flips bit `bit` (0..31) of the float at `at` in place; returns the value before. Also the ring's
// CAIRN_TEST_FLIP_AFTER_AVERAGE hook (node/ring/RingTestHooks.h).
float flipFloatBit(float* at, int bit);

}  // namespace cairn
