#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "core/Error.h"
#include "core/NodeConfigs.h"
#include "node/Probe.h"

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
  MachineProbe p;
  probeMemoryAndCores(&p);
  p.compute_gflops = probeComputeGflops(128, std::chrono::milliseconds(200));
  p.bandwidth_mbps = probeBandwidthMbps(std::nullopt, 8, std::chrono::seconds(20));
  EXPECT_GT(p.compute_gflops, 0);
  EXPECT_GT(p.bandwidth_mbps, 0);
  // What --probe prints must be accepted by the node_configs.json reader as it is.
  nlohmann::json doc = {{"0", nodeConfigEntry(p, "127.0.0.1:5000")}};
  const auto nodes = parseNodeConfigs(doc, "probe output");
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_NEAR(nodes[0].ram_gb, p.ram_gb, 0.01);
  ASSERT_TRUE(nodes[0].compute.has_value());
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
