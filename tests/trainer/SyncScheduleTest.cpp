#include <gtest/gtest.h>

#include <algorithm>

#include "core/Error.h"
#include "trainer/SyncSchedule.h"

namespace cairn {
namespace {

std::string sequence(const SyncSchedule& s) {
  std::string out;
  for (const auto& a : s.actions()) out += toString(a) + " ";
  return out;
}

TEST(SyncSchedule, OneFOneBOrderPerStage) {
  // 3 stages, 4 micro-batches: the Root warms up with 2 forwards, the Leaf with none.
  EXPECT_EQ(sequence(SyncSchedule(0, 3, 4, PipelineOrder::k1F1B, false)),
            "F0 F1 F2 B0 F3 B1 B2 B3 S ");
  EXPECT_EQ(sequence(SyncSchedule(1, 3, 4, PipelineOrder::k1F1B, false)),
            "F0 F1 B0 F2 B1 F3 B2 B3 S ");
  EXPECT_EQ(sequence(SyncSchedule(2, 3, 4, PipelineOrder::k1F1B, true)),
            "F0 B0 F1 B1 F2 B2 F3 B3 N S ");
  EXPECT_EQ(sequence(SyncSchedule(0, 3, 2, PipelineOrder::kGPipe, false)), "F0 F1 B0 B1 S ");
}

TEST(SyncSchedule, StateMachineRejectsOutOfOrderEvents) {
  SyncSchedule s(0, 1, 2, PipelineOrder::k1F1B, false);
  s.begin();
  EXPECT_EQ(toString(s.next()), "F0");
  EXPECT_THROW(s.complete({ScheduleAction::Kind::kBackward, 0}), Error);
  s.complete(s.next());
  EXPECT_EQ(toString(s.next()), "B0");
}

// Simulates every stage running its actions in order with blocking receives and buffered sends:
// every schedule must finish (no deadlock), every micro-batch must run forward before backward,
// and 1F1B must keep at most `stages` micro-batches in flight on a node.
struct Shape {
  int stages, microbatches;
  PipelineOrder order;
};
class SyncScheduleSimulation : public ::testing::TestWithParam<Shape> {};

TEST_P(SyncScheduleSimulation, CompletesWithoutDeadlock) {
  const Shape shape = GetParam();
  const int S = shape.stages, M = shape.microbatches;
  std::vector<SyncSchedule> schedules;
  for (int s = 0; s < S; ++s) {
    schedules.emplace_back(s, S, M, shape.order, true);
    schedules.back().begin();
  }
  std::vector<std::vector<bool>> forwarded(S, std::vector<bool>(M)),
      backwarded(S, std::vector<bool>(M));
  std::vector<int> in_flight(S), max_in_flight(S);
  int norm_partial = S - 1;  // the Leaf can send its partial sum at once
  std::vector<bool> norm_done(S);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; ++s) {
      SyncSchedule& sch = schedules[size_t(s)];
      if (sch.done()) continue;
      const ScheduleAction a = sch.next();
      bool ready = false;
      switch (a.kind) {
        case ScheduleAction::Kind::kForward:
          ready = s == 0 || forwarded[s - 1][a.microbatch];
          if (ready) forwarded[s][a.microbatch] = true, ++in_flight[s];
          break;
        case ScheduleAction::Kind::kBackward:
          ready = forwarded[s][a.microbatch] && (s == S - 1 || backwarded[s + 1][a.microbatch]);
          if (ready) backwarded[s][a.microbatch] = true, --in_flight[s];
          break;
        case ScheduleAction::Kind::kReduceGradNorm:
          ready = norm_partial <= s;  // partial sums arrive from downstream first
          if (ready) norm_done[s] = true, norm_partial = std::min(norm_partial, s - 1);
          break;
        case ScheduleAction::Kind::kOptimizerStep:
          ready = std::all_of(backwarded[s].begin(), backwarded[s].end(), [](bool b) { return b; });
          break;
        case ScheduleAction::Kind::kStepDone:
          break;
      }
      max_in_flight[s] = std::max(max_in_flight[s], in_flight[s]);
      if (ready) {
        sch.complete(a);
        progress = true;
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    EXPECT_TRUE(schedules[size_t(s)].done())
        << "stage " << s << " stuck at " << toString(schedules[size_t(s)].next());
    if (shape.order == PipelineOrder::k1F1B) {
      EXPECT_LE(max_in_flight[s], S - s);
    }
  }
}

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int s = 1; s <= 5; ++s)
    for (int m : {1, 2, 3, 4, 8})
      for (auto o : {PipelineOrder::k1F1B, PipelineOrder::kGPipe}) out.push_back({s, m, o});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Trainer, SyncScheduleSimulation, ::testing::ValuesIn(shapes()));

}  // namespace
}  // namespace cairn
