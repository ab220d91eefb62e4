// Deal runs of the in-memory pipeline (DealRunTest.cpp, DealChangeTest.cpp): the options of a
// 3-epoch run, a ClusterSync that records the admission steps it is told about, and the run whose
// Root is offered a grown deal (docs/TRAINING.md "the deal") from a given step on.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/ClusterSync.h"

namespace cairn::testing {

inline void dealRunOptions(TrainOptions& t) {
  t.microbatches = 2;
  t.max_steps = 0;
  t.epochs = 3;
}

// Records the admission steps it is told about; exchanges nothing.
class AdmissionRecorder : public ClusterSync {
 public:
  void start(torch::jit::Module&) override {}
  void beforeOptimizerStep(int64_t, torch::jit::Module&) override {}
  void afterOptimizerStep(int64_t, torch::jit::Module&) override {}
  void finish(int64_t, torch::jit::Module&) override {}
  void admitJoinersAt(int64_t steps_done) override { admitted.push_back(steps_done); }
  std::vector<int64_t> admitted;
};

inline constexpr int kStages = 3;  // cnn_bn_dropout's node_data
inline const nlohmann::json kGrown = {{{"from_epoch", 0}, {"clusters", 1}},
                                      {{"from_epoch", 1}, {"clusters", 2}}};

struct Offer {
  int64_t calls = 0;      // the Root asks once before every step: the call count is the step
  int64_t from_step = 0;  // offered once the Root is at this step
};

// The in-memory pipeline with node i's ClusterSync `sync_of(i)` and `offer` made to its Root;
// `used` / `data` (optional) receive the Root's dealRunOptions.
inline PipelineRun runWithOffer(Offer& offer, const std::function<ClusterSync*(int)>& sync_of,
                                TrainOptions* used = nullptr, DataOptions* data = nullptr) {
  const std::string node_data = trainerModelsDir() + "/cnn_bn_dropout/node_data";
  return runInMemoryPipeline(node_data, dealRunOptions, [&](int i, StageTrainerConfig& c) {
    c.data.chunks = 4;
    c.cluster_sync = sync_of(i);
    if (i != 0) return;
    if (used) *used = c.options;
    if (data) *data = c.data;
    // Between steps the Root asks (trainer thread).
    c.offered_deal = [&offer]() -> std::optional<nlohmann::json> {
      if (offer.calls++ < offer.from_step) return std::nullopt;
      return kGrown;
    };
  });
}

inline PipelineRun runWithOffer(Offer& offer, std::vector<AdmissionRecorder>& syncs,
                                TrainOptions* used, DataOptions* data) {
  return runWithOffer(offer, [&](int i) -> ClusterSync* { return &syncs[size_t(i)]; }, used, data);
}

}  // namespace cairn::testing
