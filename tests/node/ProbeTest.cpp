#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "core/Error.h"
#include "core/GpuFigures.h"
#include "core/NodeConfigs.h"
#include "core/TorchCompat.h"
#include "node/volunteer/Probe.h"

namespace cairn {
namespace {

// /proc/meminfo's MemTotal in bytes: an independent reading of the machine's memory.
double procMemTotalBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") return kb * 1024;
  return 0;
}

TEST(Probe, MemoryAndCoresAgreeWithTheKernel) {
  MachineProbe p;
  probeMemoryAndCores(&p);
  const double mem_total = procMemTotalBytes();
  ASSERT_GT(mem_total, 0);
  EXPECT_GT(p.ram_gb, 0);
  // hwloc's total equals MemTotal up to rounding; a cgroup limit can only lower it.
  EXPECT_LE(p.ram_gb * 1e9, mem_total * 1.01);
  EXPECT_GE(p.cores, 1);
  EXPECT_LE(p.cores, static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)));
}

TEST(Probe, EntryIsAValidNodeConfig) {
  // What --probe prints must be accepted by the node_configs.json reader as it is, every figure
  // intact (to the two decimals it is printed with). Known figures first, so each field can be
  // checked against the value that went in ...
  MachineProbe known;
  known.ram_gb = 3.456;
  known.cores = 6;
  known.compute_gflops = 41.234;
  known.bandwidth_mbps = 812.5;
  const nlohmann::json entry = nodeConfigEntry(known, "10.1.2.3:5071");
  EXPECT_EQ(entry["benchmarks"]["cores"], 6);
  const auto parsed = parseNodeConfigs({{"4", entry}}, "probe output");
  ASSERT_EQ(parsed.size(), 1u);
  EXPECT_EQ(parsed[0].id, "4");
  EXPECT_EQ(parsed[0].name, "node_4");
  EXPECT_EQ(parsed[0].host, "10.1.2.3");
  EXPECT_EQ(parsed[0].port, 5071);
  EXPECT_DOUBLE_EQ(parsed[0].ram_gb, 3.46);
  EXPECT_DOUBLE_EQ(parsed[0].bandwidth_mbps, 812.5);
  ASSERT_TRUE(parsed[0].compute.has_value());
  EXPECT_DOUBLE_EQ(*parsed[0].compute, 41.23);

  // ... then this machine's own measurement, which must make an entry the reader accepts too.
  MachineProbe p;
  probeMemoryAndCores(&p);
  p.compute_gflops = probeComputeGflops(128, std::chrono::milliseconds(200));
  p.bandwidth_mbps = probeBandwidthMbps(std::nullopt, 8, std::chrono::seconds(20));
  EXPECT_GT(p.compute_gflops, 0);
  EXPECT_GT(p.bandwidth_mbps, 0);
  const auto nodes = parseNodeConfigs({{"0", nodeConfigEntry(p, "127.0.0.1:5000")}}, "probe output");
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_NEAR(nodes[0].ram_gb, p.ram_gb, 0.005);
  EXPECT_NEAR(nodes[0].bandwidth_mbps, p.bandwidth_mbps, 0.005);
  ASSERT_TRUE(nodes[0].compute.has_value());
  EXPECT_NEAR(*nodes[0].compute, p.compute_gflops, 0.005);
  EXPECT_EQ(nodes[0].address(), "127.0.0.1:5000");
}

TEST(Probe, GpusAreListedOnlyWhenLibtorchSeesOne) {
  // Debian's libtorch (the CI build) is CPU-only: no GPU, a reason, and no driver loaded. On a
  // CUDA build with a GPU, every device is listed with figures inside core/GpuFigures.h's bounds.
  std::string reason;
  const std::vector<GpuFigures> gpus = probeGpus(&reason);
  if (torch::cuda::device_count() == 0) {
    EXPECT_TRUE(gpus.empty());
    EXPECT_NE(reason.find("sees no CUDA device"), std::string::npos) << reason;
    EXPECT_NE(reason.find("libtorch " + libtorchVersion()), std::string::npos) << reason;
  } else {
    ASSERT_EQ(gpus.size(), torch::cuda::device_count()) << reason;
    EXPECT_NO_THROW(parseGpuFigures(gpuFiguresToJson(gpus), "probeGpus"));
  }
}

TEST(Probe, EntryCarriesGpusOnlyWhenThereAreSome) {
  MachineProbe p;
  p.ram_gb = 64;
  p.cores = 16;
  p.compute_gflops = 900;
  p.bandwidth_mbps = 1000;
  // No GPU: the entry is exactly today's, which the node_configs.json reader takes.
  nlohmann::json entry = nodeConfigEntry(p, "10.0.0.2:5500");
  EXPECT_FALSE(entry["benchmarks"].contains("gpus"));
  EXPECT_EQ(parseNodeConfigs({{"2", entry}}, "probe output").size(), 1u);
  const std::string none = probeSummary(p, "no CUDA here");
  EXPECT_NE(none.find("CPU: 16 cores, 64.0 GB RAM, 900.0 GFLOPS"), std::string::npos) << none;
  EXPECT_NE(none.find("GPUs: none (no CUDA here)"), std::string::npos) << none;

  // Two GPUs: benchmarks.gpus in core/GpuFigures.h's schema, figures as measured.
  p.gpus = {{"NVIDIA H100 80GB HBM3", 79.1, 51.0, 600.0, 25.0, 24.0},
            {"NVIDIA A100-SXM4-40GB", 42.5, 19.5, 280.0, 24.5, 23.5}};
  entry = nodeConfigEntry(p, "10.0.0.2:5500");
  ASSERT_TRUE(entry["benchmarks"].contains("gpus"));
  EXPECT_EQ(entry["benchmarks"]["gpus"], gpuFiguresToJson(p.gpus));
  const std::vector<GpuFigures> back = parseGpuFigures(entry["benchmarks"]["gpus"], "entry");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].name, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(back[0].bf16_tflops, 600.0);
  EXPECT_EQ(entry["benchmarks"]["ram"], 64.0);  // the CPU figures stay as they were
  const auto nodes = parseNodeConfigs({{"2", entry}}, "probe output");  // clusterize reads it
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(gpuFiguresToJson(nodes[0].gpus), gpuFiguresToJson(p.gpus));
  const std::string two = probeSummary(p, "");
  EXPECT_EQ(two.find("GPUs: none"), std::string::npos) << two;
  EXPECT_NE(two.find("GPU 0: NVIDIA H100 80GB HBM3, 79.1 GB; dense TFLOP/s fp32 51.0, bf16 600.0; "
                     "pinned copies GB/s host->device 25.0, device->host 24.0"),
            std::string::npos)
      << two;
  EXPECT_NE(two.find("GPU 1: NVIDIA A100-SXM4-40GB, 42.5 GB"), std::string::npos) << two;
}

TEST(Probe, AbsentPeerIsReportedByName) {
  try {
    probeBandwidthMbps(std::string("127.0.0.1:1"), 1, std::chrono::seconds(1));
    FAIL();
  } catch (const PeerLost& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cairn
