// The Root's activations leave after its next forward is queued (TimedLink::sendLater, issue [M]):
// on a GPU the copy of micro-batch k to the host then runs behind the forward of k + 1 instead of
// holding back its launch. Checked on the CPU with a test double for the device that logs when
// the Root's inputs cross to it (a forward begins) and when a gradient does (a backward begins),
// and a hook on the in-memory links that logs each activation as it leaves: under GPipe the Root's
// log must be exactly "input 0, input 1, sent 0, input 2, sent 1, …, sent M-1" before the first
// gradient, where the CPU placement sends each one at once. The values are not touched: the run
// trains bit for bit as the same run through the CPU placement, under 1F1B too.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Device.h"

namespace cairn {
namespace {

class LoggingDevice final : public TensorPlacement {
 public:
  LoggingDevice(std::mutex& mutex, std::vector<std::string>& log) : mutex_(mutex), log_(log) {}
  // The host's tensors, as a device whose copies to the host run behind the host thread.
  torch::Device device() const override { return torch::kCPU; }
  bool copiesLater() const override { return true; }
  torch::Tensor toDevice(const torch::Tensor& t) const override {
    // The fixture CNN's Root takes images [rows, 1, 8, 8]; its gradients come as [rows, 4, 4, 4].
    if (t.defined() && t.is_floating_point() && t.dim() == 4) {
      std::lock_guard<std::mutex> lock(mutex_);
      log_.push_back(t.size(1) == 1 ? "input" : "gradient");
    }
    return t;
  }
  torch::Tensor toHost(const torch::Tensor& t) const override { return t; }

 private:
  std::mutex& mutex_;
  std::vector<std::string>& log_;
};

// The test CNN cut in 3 stages (make_test_models.py).
std::string threeStageCnn() { return testing::trainerModelsDir() + "/cnn/node_data"; }

// The runs compared here: 2 steps of 4 micro-batches in `order`.
std::function<void(TrainOptions&)> twoStepsOf4(PipelineOrder order) {
  return [order](TrainOptions& t) {
    t.microbatches = 4;
    t.max_steps = 2;
    t.pipeline = order;
  };
}

std::vector<std::string> rootLog(PipelineOrder order, testing::PipelineRun* run) {
  std::mutex mutex;
  std::vector<std::string> log;
  const auto device = std::make_shared<LoggingDevice>(mutex, log);
  *run = testing::runInMemoryPipeline(
      threeStageCnn(), twoStepsOf4(order),
      [&](int i, StageTrainerConfig& c) {
        if (i == 0) c.placement = device;
      },
      [&](int from, const StagePacket& p) {
        if (from != 0 || p.kind != PacketKind::kActivation) return;
        std::lock_guard<std::mutex> lock(mutex);
        log.push_back("sent " + std::to_string(p.microbatch));
      });
  return log;
}

// `a` trained bit for bit as the same run through the CPU placement, in `order`.
void expectSameTrainingAsTheCpuPlacement(const testing::PipelineRun& a, PipelineOrder order) {
  const testing::PipelineRun b = testing::runInMemoryPipeline(threeStageCnn(), twoStepsOf4(order));
  ASSERT_EQ(a.losses.size(), 2u);
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (const auto& [name, p] : a.parameters) EXPECT_TRUE(torch::equal(p, b.parameters.at(name))) << name;
}

TEST(Device, TheRootsActivationsLeaveAfterItsNextForwardIsQueued) {
  testing::PipelineRun later;
  const std::vector<std::string> log = rootLog(PipelineOrder::kGPipe, &later);
  const std::vector<std::string> step = {"input",  "input",  "sent 0", "input",    "sent 1",
                                         "input",  "sent 2", "sent 3", "gradient", "gradient",
                                         "gradient", "gradient"};
  ASSERT_EQ(log.size(), 2 * step.size());
  for (size_t i = 0; i < log.size(); ++i) EXPECT_EQ(log[i], step[i % step.size()]) << "entry " << i;
  expectSameTrainingAsTheCpuPlacement(later, PipelineOrder::kGPipe);
}

TEST(Device, TheRootSendingLaterTrainsAsItDidUnder1F1B) {
  testing::PipelineRun later;
  const std::vector<std::string> log = rootLog(PipelineOrder::k1F1B, &later);
  // Every activation leaves once, in order.
  std::vector<std::string> sent;
  for (const std::string& e : log)
    if (e.rfind("sent", 0) == 0) sent.push_back(e);
  EXPECT_EQ(sent, (std::vector<std::string>{"sent 0", "sent 1", "sent 2", "sent 3", "sent 0",
                                            "sent 1", "sent 2", "sent 3"}));
  expectSameTrainingAsTheCpuPlacement(later, PipelineOrder::k1F1B);
}

}  // namespace
}  // namespace cairn
