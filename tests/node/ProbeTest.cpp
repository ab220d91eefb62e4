#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "core/Error.h"
#include "core/NodeConfigs.h"
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
