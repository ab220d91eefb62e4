// Devices (trainer/Device.h, issue [M]): --device parsing and its refusals, and the checkpoint
// code's device mapping. The mapping is tested on the CPU with a test double for the target
// device whose tensors hold the *negated* values of the host's (integers: mirrored): a checkpoint
// file written through it must hold the negation of every stage and optimizer tensor in memory
// (each crossed toHost), and a trainer resumed through it must hold the negation of the file's
// (each crossed toDevice), so a tensor that skips either crossing makes the test fail. The real GPU round trip (save on
// CUDA, resume on the CPU, equal bit for bit) runs only where CUDA is, and is skipped with its
// reason elsewhere.
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "core/Error.h"
#include "core/Safetensors.h"
#include "tests/common/ScratchDir.h"
#include "tests/trainer/InMemoryPipeline.h"
#include "tests/trainer/TrainerTestPaths.h"
#include "trainer/Checkpoint.h"
#include "trainer/Device.h"
#include "trainer/Int8Boundary.h"
#include "trainer/ReservedTensors.h"
#include "trainer/TrainerContext.h"

namespace cairn {
namespace {

std::string cnnNodeData() {
  return testing::trainerModelsDir() + "/cnn_bn_dropout/node_data";
}

// A fresh folder, removed when the test passes (tests/common/ScratchDir.h).
std::string deviceScratch(const std::string& name) { return testing::scratchDir("device_" + name); }

// Expects BadInput whose message holds every one of `parts`.
void expectRefusal(const std::string& device, const std::vector<std::string>& parts) {
  try {
    resolveDevice(device, "--device");
    FAIL() << device << " was accepted";
  } catch (const BadInput& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message of " << device << ": " << e.what() << "\nlacks: " << part;
  }
}

TEST(Device, CpuAndAutoResolve) {
  EXPECT_EQ(resolveDevice("cpu", "--device"), torch::Device(torch::kCPU));
  const torch::Device expected =
      torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  EXPECT_EQ(resolveDevice("auto", "--device"), expected);
}

TEST(Device, MalformedNamesAreRefusedNamingTheFlag) {
  for (const char* bad : {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cuda:01", "cuda:12345",
                          "cpu:0", "", " cpu", "mps"})
    expectRefusal(bad, {"--device", "expected auto, cpu, cuda or cuda:N"});
}

TEST(Device, CudaWithoutCudaSaysWhy) {
  if (torch::cuda::is_available()) {
    // A CUDA machine: only an index past the devices is refused.
    const std::string past = "cuda:" + std::to_string(torch::cuda::device_count());
    expectRefusal(past, {"--device", "CUDA device(s), numbered from 0"});
    return;
  }
  const std::string why = cudaBuild() ? "sees no usable CUDA device" : "without CUDA";
  for (const char* name : {"cuda", "cuda:0", "cuda:3"}) expectRefusal(name, {"--device", why});
}

TEST(Device, CpuPlacementMovesNothing) {
  const auto placement = makePlacement(torch::kCPU);
  const torch::Tensor t = torch::arange(6).reshape({2, 3});
  EXPECT_TRUE(placement->toDevice(t).is_same(t));
  EXPECT_TRUE(placement->toHost(t).is_same(t));
  EXPECT_FALSE(placement->toHost(torch::Tensor()).defined());
  EXPECT_FALSE(placement->copiesLater()) << "the CPU sends at once";
}

// CAIRN_TEST_SEND_LATER (trainer/Device.cpp), the hook integration.two_clusters_sending_later and
// tools/gpu/overhead.py --at-once use: 1 holds sends back everywhere, 0 nowhere, unset each
// device's way; anything else names the variable. (The CUDA side runs in the GPU script.)
TEST(Device, TheSendLaterHookIsReadAndChecked) {
  const char* before = std::getenv("CAIRN_TEST_SEND_LATER");
  const std::string kept = before ? before : "";
  ::setenv("CAIRN_TEST_SEND_LATER", "1", 1);
  EXPECT_TRUE(makePlacement(torch::kCPU)->copiesLater());
  ::setenv("CAIRN_TEST_SEND_LATER", "0", 1);
  EXPECT_FALSE(makePlacement(torch::kCPU)->copiesLater());
  ::setenv("CAIRN_TEST_SEND_LATER", "yes", 1);
  try {
    (void)makePlacement(torch::kCPU);
    ADD_FAILURE() << "CAIRN_TEST_SEND_LATER=yes was taken";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("CAIRN_TEST_SEND_LATER=\"yes\""), std::string::npos)
        << e.what();
  }
  ::unsetenv("CAIRN_TEST_SEND_LATER");
  EXPECT_FALSE(makePlacement(torch::kCPU)->copiesLater());
  if (before) ::setenv("CAIRN_TEST_SEND_LATER", kept.c_str(), 1);
}

// The test double's map between host and "device" values, its own inverse: a floating-point
// tensor is negated, an integer one mirrored (x -> 4 - x), which keeps the Leaf's targets, the
// fixture CNN's class ids 0-4 that cross to the device before its loss, class ids.
torch::Tensor mirrored(const torch::Tensor& t) {
  return t.is_floating_point() ? t.neg() : torch::full_like(t, 4) - t;
}

// The test double: a "device" whose tensors hold the mirrored values of the host's.
class MirroringPlacement final : public TensorPlacement {
 public:
  torch::Device device() const override { return torch::kCPU; }
  torch::Tensor toDevice(const torch::Tensor& t) const override { return crossed(t); }
  torch::Tensor toHost(const torch::Tensor& t) const override { return crossed(t); }

 private:
  static torch::Tensor crossed(const torch::Tensor& t) {
    if (!t.defined()) return t;
    // Generator states are bytes: no map keeps them meaningful, and none is asked for.
    EXPECT_NE(t.scalar_type(), torch::kByte) << "a generator state crossed to the device";
    return mirrored(t);
  }
};

void twoSteps(TrainOptions& t) {
  t.optimizer.kind = OptimizerKind::kAdamW;
  t.optimizer.lr = 1e-2;
  t.microbatches = 2;
  t.max_steps = 2;
  t.checkpoint_every = 2;
}

// The stage and optimizer tensors of a node's checkpoint of step 2, by name.
std::map<std::string, torch::Tensor> checkpointState(const std::string& dir) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : readCheckpoint(dir, 2).tensors)
    if (name.rfind("stage.", 0) == 0 || name.rfind("optim.", 0) == 0) out[name] = t;
  return out;
}

TEST(Device, CheckpointsCrossToTheHostAndBackForEveryTensor) {
  const std::string dir = deviceScratch("mapping");
  const auto placement = std::make_shared<MirroringPlacement>();
  auto at = [&](int i) { return dir + "/node_" + std::to_string(i); };
  auto throughDouble = [&](int i, StageTrainerConfig& c) {
    c.checkpoint_dir = at(i);
    c.placement = placement;
  };
  const testing::PipelineRun written =
      testing::runInMemoryPipeline(cnnNodeData(), twoSteps, throughDouble);
  // What the trained stages hold "on the device", by the checkpoint's names.
  std::map<std::string, torch::Tensor> stage_values;
  for (const auto& [name, t] : written.parameters) stage_values["stage." + name] = t;
  for (const auto& [name, t] : written.buffers) stage_values["stage." + name] = t;
  std::vector<std::map<std::string, torch::Tensor>> files(3);
  size_t stage_tensors = 0;
  for (int i = 0; i < 3; ++i) {
    files[size_t(i)] = checkpointState(at(i));
    ASSERT_EQ(written.optimizer_state.size(), 3u);
    const auto& optimizer = written.optimizer_state[size_t(i)];
    size_t optimizer_tensors = 0;
    for (const auto& [name, t] : files[size_t(i)]) {
      const bool optim = name.rfind("optim.", 0) == 0;
      const auto& memory = optim ? optimizer : stage_values;
      ASSERT_TRUE(memory.count(name)) << "node_" << i << " " << name;
      EXPECT_TRUE(torch::equal(t, mirrored(memory.at(name))))
          << "node_" << i << " " << name << " was written without crossing to the host";
      ++(optim ? optimizer_tensors : stage_tensors);
    }
    EXPECT_EQ(optimizer_tensors, optimizer.size()) << "node_" << i;
    EXPECT_GT(optimizer_tensors, 0u) << "node_" << i;
  }
  EXPECT_EQ(stage_tensors, stage_values.size());

  // Resumed through the double at step 2 (the run's end: no step changes what was loaded), the
  // stage and optimizer tensors in memory are the negation of the file's.
  const testing::PipelineRun resumed = testing::runInMemoryPipeline(
      cnnNodeData(), twoSteps, [&](int i, StageTrainerConfig& c) {
        throughDouble(i, c);
        c.resume_step = 2;
      });
  EXPECT_EQ(resumed.results[0].steps, 2);
  size_t loaded = 0;
  for (int i = 0; i < 3; ++i) {
    for (const auto& [name, t] : files[size_t(i)]) {
      const bool optim = name.rfind("optim.", 0) == 0;
      const torch::Tensor memory = optim ? resumed.optimizer_state[size_t(i)].at(name)
                                   : resumed.parameters.count(name.substr(6))
                                       ? resumed.parameters.at(name.substr(6))
                                       : resumed.buffers.at(name.substr(6));
      EXPECT_TRUE(torch::equal(memory, mirrored(t)))
          << "node_" << i << " " << name << " was loaded without crossing to the device";
      ++loaded;
    }
  }
  EXPECT_GT(loaded, 0u);
}

// What crosses in training: a double that keeps each tensor it is asked to move, each way.
class KeepingPlacement final : public TensorPlacement {
 public:
  torch::Device device() const override { return torch::kCPU; }
  torch::Tensor toDevice(const torch::Tensor& t) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    moved_.push_back(t.clone());
    return t;
  }
  torch::Tensor toHost(const torch::Tensor& t) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    read_.push_back(t.clone());
    return t;
  }
  std::vector<torch::Tensor> moved() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return moved_;
  }
  std::vector<torch::Tensor> read() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return read_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::vector<torch::Tensor> moved_, read_;
};

// The Leaf's targets cross to its device through the placement, one micro-batch at a time, the
// same values its loss reads (on a GPU: queued before the forward, not copied after it, which
// would wait for the forward); the Root and the Stem move no integer tensor.
TEST(Device, TheLeafsTargetsCrossThroughThePlacement) {
  std::vector<std::shared_ptr<KeepingPlacement>> placements;
  for (int i = 0; i < 3; ++i) placements.push_back(std::make_shared<KeepingPlacement>());
  std::vector<std::vector<torch::Tensor>> targets(3);  // per node, each micro-batch's in order
  const testing::PipelineRun run =
      testing::runInMemoryPipeline(cnnNodeData(), twoSteps, [&](int i, StageTrainerConfig& c) {
        c.placement = placements[size_t(i)];
      });
  ASSERT_EQ(run.results[2].steps, 2);
  for (int i = 0; i < 3; ++i)
    for (const torch::Tensor& t : placements[size_t(i)]->moved())
      if (!t.is_floating_point()) targets[size_t(i)].push_back(t);
  EXPECT_TRUE(targets[0].empty());
  EXPECT_TRUE(targets[1].empty());
  // 2 steps of 2 micro-batches of 16 (twoSteps; the fixture's batch is 32)
  ASSERT_EQ(targets[2].size(), 4u);
  // The reference: the data file's labels of the samples the Root fed, step by step.
  torch::Tensor labels;
  for (auto& [name, t] : readSafetensors(testing::trainerModelsDir() + "/cnn/data.safetensors"))
    if (name == "targets") labels = t;
  ASSERT_TRUE(labels.defined());
  ASSERT_EQ(run.batches.size(), 2u);
  for (size_t k = 0; k < 4; ++k) {
    const std::vector<int64_t>& ids = run.batches[k / 2];
    ASSERT_EQ(ids.size(), 32u);
    const std::vector<int64_t> half(ids.begin() + long(16 * (k % 2)),
                                    ids.begin() + long(16 * (k % 2 + 1)));
    const torch::Tensor expected = labels.index_select(0, torch::tensor(half, torch::kLong));
    EXPECT_TRUE(torch::equal(targets[2][k], expected)) << "micro-batch " << k;
  }
}

// A stage holding the whole model (Root and Leaf at once) tells no node its loss, so it reads the
// device once per step, after the step's optimizer step is queued: one crossing of its micro-
// batches' loss shares together (on a GPU a read per micro-batch would wait for the device before
// the next micro-batch's work could be queued). The step loss it records is their sum.
// (Its training equals the unsplit model's: WholeModelEquivalence.OneStageMatchesUnsplitModel.)
TEST(Device, AWholeModelStageReadsItsLossesOncePerStep) {
  for (const ScheduleKind schedule : {ScheduleKind::kSync, ScheduleKind::kAsync}) {
    const auto placement = std::make_shared<KeepingPlacement>();
    const testing::PipelineRun run = testing::runInMemoryPipeline(
        testing::trainerModelsDir() + "/cnn/whole/node_data",
        [&](TrainOptions& t) {
          t.microbatches = 4;
          t.max_steps = 3;
          t.schedule = schedule;
        },
        [&](int, StageTrainerConfig& c) { c.placement = placement; });
    ASSERT_EQ(run.losses.size(), 3u);
    const std::vector<torch::Tensor> read = placement->read();
    ASSERT_EQ(read.size(), 3u) << "one read per step, schedule " << toString(schedule);
    for (size_t step = 0; step < 3; ++step) {
      ASSERT_EQ(read[step].scalar_type(), torch::kDouble);
      ASSERT_EQ(read[step].numel(), 4) << "the step's 4 micro-batches' shares";
      double sum = 0;
      for (int64_t k = 0; k < 4; ++k) sum += read[step][k].item<double>();
      EXPECT_GT(read[step].min().item<double>(), 0) << "a cross-entropy share is positive";
      EXPECT_EQ(run.losses[step], sum) << "step " << step;
    }
  }
}

// The real thing where a GPU is: save on CUDA, resume on the CPU, bit for bit.
TEST(Device, CudaCheckpointResumesOnTheCpuBitForBit) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device here (this libtorch "
                 << (cudaBuild() ? "has CUDA but sees no GPU" : "is CPU-only")
                 << "): the GPU script (../shared/device) runs this case";
  const std::string dir = deviceScratch("cuda");
  auto at = [&](int i) { return dir + "/node_" + std::to_string(i); };
  const auto cuda = makePlacement(torch::Device(torch::kCUDA, 0));
  testing::runInMemoryPipeline(cnnNodeData(), twoSteps, [&](int i, StageTrainerConfig& c) {
    c.checkpoint_dir = at(i);
    c.placement = cuda;
  });
  std::vector<std::map<std::string, torch::Tensor>> written(3);
  for (int i = 0; i < 3; ++i) written[size_t(i)] = checkpointState(at(i));
  const testing::PipelineRun resumed = testing::runInMemoryPipeline(
      cnnNodeData(), twoSteps, [&](int i, StageTrainerConfig& c) {
        c.checkpoint_dir = at(i);
        c.resume_step = 2;  // no placement: the CPU
      });
  for (const auto& [name, t] : resumed.parameters) {
    ASSERT_TRUE(t.device().is_cpu()) << name;
    bool found = false;
    for (const auto& file : written)
      if (file.count("stage." + name)) {
        found = true;
        EXPECT_TRUE(torch::equal(t, file.at("stage." + name))) << name;
      }
    EXPECT_TRUE(found) << name;
  }
}

// Where a GPU is: the int8 wire form computed on it (TimedLink encodes there) equals the host's bit
// for bit, so a receiver cannot tell which side encoded. The encoder divides by a tensor, not by a
// host scalar, which CUDA turns into a product with its reciprocal (one bit off at times). And a
// wire form decoded there (MailboxStageLink::decodeOn) gives the host's float32 values.
TEST(Device, Int8WireFormOnCudaEqualsTheHostsBitForBit) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device here (this libtorch "
                 << (cudaBuild() ? "has CUDA but sees no GPU" : "is CPU-only")
                 << "): the GPU script (../shared/device) runs this case";
  torch::manual_seed(11);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{64, 100}, {8, 16, 7, 7}, {4, 32, 256}}) {
    torch::Tensor x = torch::randn(shape) * 3.7;
    torch::Tensor rows = x.view({-1, x.size(-1)});
    rows[0].zero_();                                                      // scale 0
    rows[1][0] = std::numeric_limits<float>::quiet_NaN();                 // scale NaN
    rows[2].fill_(0.0f), rows[2][0] = 127.0f, rows[2][1] = 2.5f;          // a tie: 2.5 -> 2
    const torch::Tensor host = encodeInt8Boundary(x);
    const torch::Tensor device = encodeInt8Boundary(x.to(torch::kCUDA)).to(torch::kCPU);
    EXPECT_TRUE(torch::equal(host, device)) << x.sizes();
    const torch::Tensor decoded = decodeInt8Boundary(host, x.sizes());
    const torch::Tensor decoded_there = decodeInt8Boundary(host.to(torch::kCUDA), x.sizes());
    EXPECT_TRUE(decoded_there.is_cuda());
    // equal_nan: row 1 decodes to NaN on both sides
    EXPECT_TRUE(torch::allclose(decoded, decoded_there.to(torch::kCPU), 0, 0, /*equal_nan=*/true))
        << x.sizes();
  }
}

// Where a GPU is: a whole-model stage trains on the last CUDA device of the machine (on one with
// several, not GPU 0), that device is current on the thread that trains (makeCurrentDevice, read
// there at every step through the stop poll), and its step losses (read once per step) are the
// CPU run's within float rounding (fp32-strict: no TF32).
TEST(Device, AWholeModelStageTrainsOnItsCudaDeviceMadeCurrent) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA device here (this libtorch "
                 << (cudaBuild() ? "has CUDA but sees no GPU" : "is CPU-only")
                 << "): the GPU script (../shared/device) runs this case";
  const auto gpu = torch::Device(torch::kCUDA, c10::DeviceIndex(torch::cuda::device_count() - 1));
  auto options = [](TrainOptions& t) {
    t.microbatches = 4;
    t.max_steps = 3;
    t.precision = Precision::kFp32Strict;
  };
  const std::string node_data = testing::trainerModelsDir() + "/cnn/whole/node_data";
  const testing::PipelineRun cpu = testing::runInMemoryPipeline(node_data, options);
  std::mutex mutex;
  std::vector<c10::DeviceIndex> current;
  const testing::PipelineRun cuda =
      testing::runInMemoryPipeline(node_data, options, [&](int, StageTrainerConfig& c) {
        c.placement = makePlacement(gpu);
        c.stop_requested = [&] {
          std::lock_guard<std::mutex> lock(mutex);
          current.push_back(c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA).getDevice().index());
          return false;
        };
      });
  ASSERT_EQ(cuda.losses.size(), 3u);
  ASSERT_FALSE(current.empty());
  for (c10::DeviceIndex index : current) EXPECT_EQ(index, gpu.index());
  for (size_t step = 0; step < 3; ++step)
    EXPECT_NEAR(cuda.losses[step], cpu.losses[step], 1e-4) << "step " << step;
}

// Wire compression before the crossing (TimedLink, wire.activations bf16/fp16/int8): off the host,
// a float32 activation, gradient or evaluation output takes its wire form on its device (bf16 and
// fp16 a cast, int8 the rows with scales of trainer/Int8Boundary.h) and crosses already in it,
// bit for bit what the link's encoding on the host would give; reserved tensors, other dtypes,
// control packets and fp32 cross as they are. On the CPU the link gets the packet untouched. The
// "GPU" here is a test double: its tensors are the host's, it only says it is not the CPU and
// records the dtype of each crossing.
class KeepingLink final : public StageLink {
 public:
  void send(Neighbour, const StagePacket& packet) override { sent.push_back(packet); }
  StagePacket receive(Neighbour, PacketKind, uint64_t, uint64_t, const std::string&) override {
    ADD_FAILURE() << "nothing is received here";
    return {};
  }
  std::vector<StagePacket> sent;
};

class RecordingGpuPlacement final : public TensorPlacement {
 public:
  torch::Device device() const override { return torch::Device(torch::kCUDA, 0); }
  torch::Tensor toDevice(const torch::Tensor& t) const override { return t; }
  torch::Tensor toHost(const torch::Tensor& t) const override {
    crossed.push_back(t.scalar_type());
    return t;
  }
  mutable std::vector<torch::ScalarType> crossed;
};

StagePacket mixedPacket(PacketKind kind) {
  torch::manual_seed(7);
  StagePacket p;
  p.kind = kind;
  p.tensors = {{"hidden", torch::randn({4, 3}, torch::requires_grad())},
               {"positions", torch::arange(4)},
               {"scale", torch::randn({2}, torch::kDouble)},
               {kTargetsTensor, torch::randn({4})},
               {kLossTensor, torch::randn({})}};
  return p;
}

TEST(Device, WireCastsHappenOnTheDeviceBeforeTheCrossing) {
  const StagePacket packet = mixedPacket(PacketKind::kActivation);
  const torch::Tensor hidden = packet.tensors[0].second.detach();
  // What the link on the host would send for "hidden" (MailboxStageLink::send).
  const std::vector<std::pair<WireCodec, torch::Tensor>> cases = {
      {WireCodec::kBf16, hidden.to(torch::kBFloat16)}, {WireCodec::kFp16, hidden.to(torch::kHalf)},
      {WireCodec::kFp32, hidden}, {WireCodec::kInt8, encodeInt8Boundary(hidden)}};
  for (const auto& [wire, on_the_wire] : cases) {
    const torch::ScalarType hidden_dtype = on_the_wire.scalar_type();
    for (PacketKind kind : {PacketKind::kActivation, PacketKind::kGradient, PacketKind::kEvaluation}) {
      KeepingLink link;
      StepTimes times;
      RecordingGpuPlacement gpu;
      TimedLink timed(link, times, gpu, wire);
      StagePacket p = mixedPacket(kind);
      timed.send(Neighbour::kDownstream, p);
      ASSERT_EQ(link.sent.size(), 1u);
      const StagePacket& sent = link.sent[0];
      const std::vector<torch::ScalarType> expected = {hidden_dtype, torch::kLong, torch::kDouble,
                                                       torch::kFloat, torch::kFloat};
      EXPECT_EQ(gpu.crossed, expected) << toString(kind);
      ASSERT_EQ(sent.tensors.size(), 5u);
      EXPECT_TRUE(torch::equal(sent.tensors[0].second, on_the_wire)) << toString(kind);
      for (size_t i = 1; i < 5; ++i)
        EXPECT_TRUE(sent.tensors[i].second.is_same(p.tensors[i].second)) << sent.tensors[i].first;
    }
  }
  // A control packet crosses as it is; so does everything on the CPU (the link compresses there).
  KeepingLink link;
  StepTimes times;
  RecordingGpuPlacement gpu;
  TimedLink(link, times, gpu, WireCodec::kBf16).send(Neighbour::kUpstream,
                                                      mixedPacket(PacketKind::kControl));
  EXPECT_EQ(gpu.crossed.front(), torch::kFloat);
  const auto cpu = makePlacement(torch::kCPU);
  TimedLink(link, times, *cpu, WireCodec::kBf16).send(Neighbour::kDownstream, packet);
  ASSERT_EQ(link.sent.size(), 2u);
  EXPECT_TRUE(link.sent[1].tensors[0].second.is_same(packet.tensors[0].second));
}

}  // namespace
}  // namespace cairn
