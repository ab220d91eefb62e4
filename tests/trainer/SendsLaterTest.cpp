// What a pass sends leaves after the next pass is queued (TimedLink::sendLater, issue [M]): on a
// GPU the copy of micro-batch k to the host then runs behind the work of k + 1 instead of holding
// back its launch. Checked on the CPU with test doubles for the device:
// - TimedLink alone, over a scripted link: a packet held back stays held through a receive only
//   when the awaited packet has arrived (StageLink::tryReceive); before any wait it leaves.
// - The Root of a 3-stage pipeline under GPipe: its inputs cross to the device as its forwards
//   begin, and the log must be exactly "input 0, input 1, sent 0, input 2, sent 1, …" before the
//   first gradient, where the CPU placement sends each one at once.
// - The Stem of that pipeline under GPipe, its neighbours' packets of a step all there before it
//   takes the first (so no wait comes between, and the log is the same every run): activations
//   and gradients alike leave after the next one's crossing.
// - Every stage sending later at once, under GPipe, 1F1B and the async schedule: each stage sends
//   the same packets in the same order as through the CPU placement, and the run trains bit for
//   bit as the CPU placement's.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Device.h"
#include "trainer/TrainerContext.h"

namespace cairn {
namespace {

using Log = std::vector<std::string>;

// The host's tensors, as a device whose copies to the host run behind the host thread. Logs each
// floating-point 4-d tensor that crosses to it as `name_of` names it (nothing when it returns "").
class LoggingDevice final : public TensorPlacement {
 public:
  LoggingDevice(std::mutex& mutex, Log& log, std::function<std::string(const torch::Tensor&)> name_of)
      : mutex_(mutex), log_(log), name_of_(std::move(name_of)) {}
  torch::Device device() const override { return torch::kCPU; }
  bool copiesLater() const override { return true; }
  torch::Tensor toDevice(const torch::Tensor& t) const override {
    if (t.defined() && t.is_floating_point() && t.dim() == 4) {
      const std::string name = name_of_(t);
      std::lock_guard<std::mutex> lock(mutex_);
      if (!name.empty()) log_.push_back(name);
    }
    return t;
  }
  torch::Tensor toHost(const torch::Tensor& t) const override { return t; }

 private:
  std::mutex& mutex_;
  Log& log_;
  std::function<std::string(const torch::Tensor&)> name_of_;
};

// ---- TimedLink alone -------------------------------------------------------------------------

StagePacket packetOf(uint64_t microbatch) {
  StagePacket p;
  p.kind = PacketKind::kActivation;
  p.microbatch = microbatch;
  p.tensors = {{"a", torch::full({2, 3}, double(microbatch))}};
  return p;
}

// Logs what TimedLink asks of it: "send k", "look k" (tryReceive), "wait k" (receive).
class ScriptedLink final : public StageLink {
 public:
  void send(Neighbour, const StagePacket& p) override {
    log.push_back("send " + std::to_string(p.microbatch));
  }
  StagePacket receive(Neighbour, PacketKind, uint64_t, uint64_t microbatch,
                      const std::string&) override {
    log.push_back("wait " + std::to_string(microbatch));
    return packetOf(microbatch);
  }
  std::optional<StagePacket> tryReceive(Neighbour, PacketKind, uint64_t, uint64_t microbatch,
                                        const std::string&) override {
    log.push_back("look " + std::to_string(microbatch));
    if (!arrived.count(microbatch)) return std::nullopt;
    return packetOf(microbatch);
  }
  std::set<uint64_t> arrived;
  Log log;
};

TEST(Device, AHeldPacketStaysHeldThroughAReceiveOnlyWhenTheAwaitedPacketIsThere) {
  std::mutex mutex;
  Log crossings;
  LoggingDevice later(mutex, crossings, [](const torch::Tensor&) { return ""; });
  ScriptedLink link;
  link.arrived = {5};
  StepTimes times;
  TimedLink timed(link, times, later);
  auto receive = [&](uint64_t microbatch) {
    return timed.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, microbatch, "");
  };
  timed.sendLater(Neighbour::kDownstream, packetOf(0));
  EXPECT_TRUE(link.log.empty()) << "held back";
  EXPECT_TRUE(torch::equal(receive(5).tensor("a"), torch::full({2, 3}, 5.0)));
  timed.sendLater(Neighbour::kDownstream, packetOf(1));  // the held one leaves first
  receive(6);        // not there: the held packet leaves before the wait
  timed.flush();     // nothing is left
  timed.send(Neighbour::kDownstream, packetOf(2));
  receive(7);        // nothing held: nothing to look for
  EXPECT_EQ(link.log, (Log{"look 5", "send 0", "look 6", "send 1", "wait 6", "send 2", "wait 7"}));
  // metrics.jsonl's later_sends and held_through_receives (StepRecorder)
  EXPECT_EQ(times.later_sends, 2);
  EXPECT_EQ(times.held_through_receives, 1);

  // Through the CPU placement everything leaves at once, and a receive only waits.
  ScriptedLink cpu_link;
  cpu_link.arrived = {5};
  const auto cpu = makePlacement(torch::kCPU);
  StepTimes cpu_times;
  TimedLink on_cpu(cpu_link, cpu_times, *cpu);
  on_cpu.sendLater(Neighbour::kDownstream, packetOf(0));
  on_cpu.receive(Neighbour::kUpstream, PacketKind::kActivation, 0, 5, "");
  EXPECT_EQ(cpu_link.log, (Log{"send 0", "wait 5"}));
  EXPECT_EQ(cpu_times.later_sends + cpu_times.held_through_receives, 0);
}

// ---- In a pipeline ---------------------------------------------------------------------------

// The test CNN cut in 3 stages (make_test_models.py): the Root takes images [rows, 1, 8, 8] and
// sends [rows, 4, 4, 4]; the Stem sends [rows, 8, 2, 2] on to the Leaf.
std::string threeStageCnn() { return testing::trainerModelsDir() + "/cnn/node_data"; }
constexpr int kMicrobatches = 4;

// The runs compared here: 2 steps of 4 micro-batches in `order`, on `schedule`.
std::function<void(TrainOptions&)> twoStepsOf4(PipelineOrder order,
                                               ScheduleKind schedule = ScheduleKind::kSync) {
  return [order, schedule](TrainOptions& t) {
    t.microbatches = kMicrobatches;
    t.max_steps = 2;
    t.pipeline = order;
    t.schedule = schedule;
  };
}

std::string sentEntry(const StagePacket& p) {
  return std::string("sent ") + toString(p.kind) + " " + std::to_string(p.step) + "." +
         std::to_string(p.microbatch);
}

std::string stepless(const std::string& entry) {  // "sent activation 1.2" -> "sent activation 2"
  const size_t dot = entry.rfind('.'), space = entry.rfind(' ');
  return dot == std::string::npos ? entry : entry.substr(0, space + 1) + entry.substr(dot + 1);
}

// The packets each stage sent, in order, by stage.
using SentByStage = std::map<int, Log>;

// `a` trained bit for bit as the same run through the CPU placement, every stage sending the
// same packets in the same order.
void expectSameTrainingAsTheCpuPlacement(const testing::PipelineRun& a, const SentByStage& a_sent,
                                         const std::function<void(TrainOptions&)>& options) {
  std::mutex mutex;
  SentByStage b_sent;
  const testing::PipelineRun b = testing::runInMemoryPipeline(
      threeStageCnn(), options, {}, [&](int from, const StagePacket& p) {
        std::lock_guard<std::mutex> lock(mutex);
        b_sent[from].push_back(sentEntry(p));
      });
  ASSERT_EQ(a.losses.size(), 2u);
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (const auto& [name, p] : a.parameters) EXPECT_TRUE(torch::equal(p, b.parameters.at(name))) << name;
  EXPECT_EQ(a_sent, b_sent);
  EXPECT_EQ(a.undelivered, 0u);
}

// Trains 2 steps of 4 under GPipe with `device` (logging into `log` under `mutex`) as stage
// `stage`'s placement, that stage's sends but control packets logged too; `on_send` (optional)
// sees every packet after. The log must be `step` for each step, and the training the CPU
// placement's.
void expectStageLog(int stage, std::mutex& mutex, Log& log,
                    const std::shared_ptr<const TensorPlacement>& device, const Log& step,
                    const std::function<void(int, const StagePacket&)>& on_send = {}) {
  SentByStage sent;
  const auto options = twoStepsOf4(PipelineOrder::kGPipe);
  const testing::PipelineRun later = testing::runInMemoryPipeline(
      threeStageCnn(), options,
      [&](int i, StageTrainerConfig& c) {
        if (i == stage) c.placement = device;
      },
      [&](int from, const StagePacket& p) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          sent[from].push_back(sentEntry(p));
          if (from == stage && p.kind != PacketKind::kControl) log.push_back(stepless(sentEntry(p)));
        }
        if (on_send) on_send(from, p);
      });
  ASSERT_EQ(log.size(), 2 * step.size());
  for (size_t i = 0; i < log.size(); ++i) EXPECT_EQ(log[i], step[i % step.size()]) << "entry " << i;
  expectSameTrainingAsTheCpuPlacement(later, sent, options);
}

TEST(Device, TheRootsActivationsLeaveAfterItsNextForwardIsQueued) {
  std::mutex mutex;
  Log log;
  const auto root = std::make_shared<LoggingDevice>(mutex, log, [](const torch::Tensor& t) {
    return t.size(1) == 1 ? "input" : "gradient";
  });
  expectStageLog(0, mutex, log, root,
                 {"input", "input", "sent activation 0", "input", "sent activation 1", "input",
                  "sent activation 2", "sent activation 3", "gradient", "gradient", "gradient",
                  "gradient"});
}

// Counts the packets each node sent, by kind; a thread may wait for a count.
class SentCounter {
 public:
  void add(int from, PacketKind kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counts_[{from, kind}];
    changed_.notify_all();
  }
  // Whether node `from` has sent `n` packets of `kind` within 30 s.
  bool waitFor(int from, PacketKind kind, int64_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(30),
                             [&] { return counts_[{from, kind}] >= n; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::pair<int, PacketKind>, int64_t> counts_;
};

TEST(Device, AStemsActivationsAndGradientsLeaveAfterItsNextPassIsQueued) {
  std::mutex mutex;
  Log log;
  SentCounter counter;
  // The Stem's k-th activation (gradient) crossing waits, when it is a step's first, until the
  // Root (the Leaf) has sent the step's every activation (gradient): under GPipe they need
  // nothing from the Stem for that, so its receives find them there.
  std::map<std::string, int64_t> crossings;  // by name, on the Stem's thread only
  const auto stem = std::make_shared<LoggingDevice>(mutex, log, [&](const torch::Tensor& t) {
    const bool input = t.size(1) == 4;
    const std::string name = input ? "input" : "gradient";
    const int64_t k = crossings[name]++;
    if (k % kMicrobatches == 0 &&
        !counter.waitFor(input ? 0 : 2, input ? PacketKind::kActivation : PacketKind::kGradient,
                         (k / kMicrobatches + 1) * kMicrobatches))
      return "timed out waiting for the " + name + "s of step " + std::to_string(k / kMicrobatches);
    return name;
  });
  expectStageLog(1, mutex, log, stem,
                 {"input", "input", "sent activation 0", "input", "sent activation 1", "input",
                  "sent activation 2", "sent activation 3", "gradient", "gradient",
                  "sent gradient 0", "gradient", "sent gradient 1", "gradient",
                  "sent gradient 2", "sent gradient 3"},
                 [&](int from, const StagePacket& p) { counter.add(from, p.kind); });
}

// Every stage sends later; the packets, their order and the training are the CPU placement's.
void expectEveryStageSendingLaterTrainsAsTheCpuPlacement(
    const std::function<void(TrainOptions&)>& options) {
  std::mutex mutex;
  Log unused;
  SentByStage sent;
  const auto later = std::make_shared<LoggingDevice>(mutex, unused,
                                                     [](const torch::Tensor&) { return ""; });
  const testing::PipelineRun run = testing::runInMemoryPipeline(
      threeStageCnn(), options, [&](int, StageTrainerConfig& c) { c.placement = later; },
      [&](int from, const StagePacket& p) {
        std::lock_guard<std::mutex> lock(mutex);
        sent[from].push_back(sentEntry(p));
      });
  ASSERT_EQ(sent.size(), 3u);
  expectSameTrainingAsTheCpuPlacement(run, sent, options);
}

TEST(Device, EveryStageSendingLaterTrainsAsTheCpuPlacementUnderGPipe) {
  expectEveryStageSendingLaterTrainsAsTheCpuPlacement(twoStepsOf4(PipelineOrder::kGPipe));
}

TEST(Device, EveryStageSendingLaterTrainsAsTheCpuPlacementUnder1F1B) {
  expectEveryStageSendingLaterTrainsAsTheCpuPlacement(twoStepsOf4(PipelineOrder::k1F1B));
}

TEST(Device, EveryStageSendingLaterTrainsAsTheCpuPlacementOnTheAsyncSchedule) {
  expectEveryStageSendingLaterTrainsAsTheCpuPlacement(
      twoStepsOf4(PipelineOrder::k1F1B, ScheduleKind::kAsync));
}

}  // namespace
}  // namespace cairn
