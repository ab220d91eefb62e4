#include <gtest/gtest.h>

#include "core/Error.h"
#include "core/NodeConfigs.h"

namespace cairn {
namespace {

struct MalformedCase {
  const char* label;
  const char* document;
  const char* expected_error;  // the exact message
};

class MalformedNodeConfigs : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedNodeConfigs, RejectedWithExactMessage) {
  const MalformedCase& c = GetParam();
  try {
    parseNodeConfigs(nlohmann::json::parse(c.document), "node_configs.json");
    FAIL() << "accepted a malformed document: " << c.document;
  } catch (const BadInput& e) {
    EXPECT_EQ(std::string(e.what()), c.expected_error);
    EXPECT_EQ(e.exitCode(), 2);
  }
}

const MalformedCase kMalformed[] = {
    {"negative_ram", R"({"3": {"IP": "127.0.0.1:5003", "benchmarks": {"ram": -4, "bandwidth": 10}}})",
     "node_configs.json: node \"3\": benchmarks.ram must be a positive number (got -4)"},
    {"zero_bandwidth", R"({"3": {"IP": "127.0.0.1:5003", "benchmarks": {"ram": 4, "bandwidth": 0}}})",
     "node_configs.json: node \"3\": benchmarks.bandwidth must be a positive number (got 0)"},
    {"negative_bandwidth", R"({"7": {"IP": "h:1", "benchmarks": {"ram": 4, "bandwidth": -1.5}}})",
     "node_configs.json: node \"7\": benchmarks.bandwidth must be a positive number (got -1.5)"},
    {"missing_ram", R"({"0": {"IP": "127.0.0.1:5000", "benchmarks": {"bandwidth": 10}}})",
     "node_configs.json: node \"0\": missing key benchmarks.ram"},
    {"missing_benchmarks", R"({"0": {"IP": "127.0.0.1:5000"}})",
     "node_configs.json: node \"0\": missing key benchmarks"},
    {"missing_ip", R"({"0": {"benchmarks": {"ram": 1, "bandwidth": 10}}})",
     "node_configs.json: node \"0\": missing key IP"},
    {"ram_is_string", R"({"1": {"IP": "127.0.0.1:5000", "benchmarks": {"ram": "8", "bandwidth": 10}}})",
     "node_configs.json: node \"1\": benchmarks.ram must be a number (got string)"},
    {"ip_is_number", R"({"1": {"IP": 5000, "benchmarks": {"ram": 8, "bandwidth": 10}}})",
     "node_configs.json: node \"1\": IP must be a string (got number)"},
    {"ip_without_port", R"({"1": {"IP": "127.0.0.1", "benchmarks": {"ram": 8, "bandwidth": 10}}})",
     "node_configs.json: node \"1\": IP must be host:port, e.g. \"127.0.0.1:5000\" (got \"127.0.0.1\")"},
    {"port_out_of_range", R"({"1": {"IP": "127.0.0.1:70000", "benchmarks": {"ram": 8, "bandwidth": 10}}})",
     "node_configs.json: node \"1\": IP port must be between 1 and 65535 (got 70000)"},
    {"typo_key", R"({"1": {"IP": "127.0.0.1:5000", "benchmarks": {"ram": 8, "bandwith": 10}}})",
     "node_configs.json: node \"1\": benchmarks.bandwith is not a known key (expected one of ram, "
     "bandwidth, compute, cores, gpus)"},
    {"node_not_object", R"({"1": [1, 2]})",
     "node_configs.json: node \"1\": the document must be an object (got array)"},
    {"top_level_array", R"([1, 2])",
     "node_configs.json: expected an object mapping node ids to nodes (got array)"},
    {"empty", R"({})", "node_configs.json: no nodes (the object is empty)"},
    {"bad_id", R"({"a/b": {"IP": "127.0.0.1:5000", "benchmarks": {"ram": 8, "bandwidth": 10}}})",
     "node_configs.json: node \"a/b\": node ids may use only letters, digits, '_' and '-' (at most 64)"},
    {"duplicate_address",
     R"({"1": {"IP": "127.0.0.1:5000", "benchmarks": {"ram": 8, "bandwidth": 10}},
         "2": {"IP": "127.0.0.1:5000", "benchmarks": {"ram": 8, "bandwidth": 10}}})",
     "node_configs.json: node \"2\": IP 127.0.0.1:5000 is already used by node \"1\""},
    {"negative_compute",
     R"({"1": {"IP": "127.0.0.1:5000", "benchmarks": {"ram": 8, "bandwidth": 10, "compute": -2}}})",
     "node_configs.json: node \"1\": benchmarks.compute must be a positive number (got -2)"},
    // benchmarks.gpus: core/GpuFigures.h's vocabulary; every refusal names the key.
    {"gpus_not_array",
     R"({"1": {"IP": "h:1", "benchmarks": {"ram": 8, "bandwidth": 10, "gpus": {"name": "x"}}}})",
     "node_configs.json: node \"1\": benchmarks.gpus must be an array of GPU objects (got object)"},
    {"gpu_not_object",
     R"({"1": {"IP": "h:1", "benchmarks": {"ram": 8, "bandwidth": 10, "gpus": [3]}}})",
     "node_configs.json: node \"1\": benchmarks.gpus[0] must be an object (got number)"},
    {"gpu_missing_fp32",
     R"({"1": {"IP": "h:1", "benchmarks": {"ram": 8, "bandwidth": 10, "gpus": [{"name": "G",
         "memory_gb": 24, "bf16_tflops": 150, "h2d_gb_per_s": 20, "d2h_gb_per_s": 20}]}}})",
     "node_configs.json: node \"1\": benchmarks.gpus[0]: missing key fp32_tflops"},
    {"gpu_zero_memory",
     R"({"1": {"IP": "h:1", "benchmarks": {"ram": 8, "bandwidth": 10, "gpus": [{"name": "G",
         "memory_gb": 0, "fp32_tflops": 40, "bf16_tflops": 150, "h2d_gb_per_s": 20,
         "d2h_gb_per_s": 20}]}}})",
     "node_configs.json: node \"1\": benchmarks.gpus[0]: memory_gb must be a positive number (got 0)"},
    {"gpu_implausible_copy",
     R"({"1": {"IP": "h:1", "benchmarks": {"ram": 8, "bandwidth": 10, "gpus": [{"name": "G",
         "memory_gb": 24, "fp32_tflops": 40, "bf16_tflops": 150, "h2d_gb_per_s": 5000,
         "d2h_gb_per_s": 20}]}}})",
     "node_configs.json: node \"1\": benchmarks.gpus[0]: h2d_gb_per_s must be at most 1000 GB/s "
     "(got 5000.000000): no GPU measures that much"},
    {"gpu_typo_key",
     R"({"1": {"IP": "h:1", "benchmarks": {"ram": 8, "bandwidth": 10, "gpus": [{"name": "G",
         "memory_gb": 24, "fp32_tflop": 40}]}}})",
     "node_configs.json: node \"1\": benchmarks.gpus[0]: fp32_tflop is not a known key (expected "
     "one of name, memory_gb, fp32_tflops, bf16_tflops, h2d_gb_per_s, d2h_gb_per_s)"},
};

INSTANTIATE_TEST_SUITE_P(Table, MalformedNodeConfigs, ::testing::ValuesIn(kMalformed),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(NodeConfigs, ParsesRavnestFormatInNumericIdOrder) {
  const auto nodes = parseNodeConfigs(nlohmann::json::parse(R"({
    "10": {"IP": "127.0.0.1:5010", "benchmarks": {"ram": 16, "bandwidth": 10}},
    "2":  {"IP": "127.0.0.1:5002", "benchmarks": {"ram": 8, "bandwidth": 20, "compute": 3.5}}
  })"), "node_configs.json");
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].name, "node_2");  // 2 before 10: numeric, not lexicographic
  EXPECT_EQ(nodes[0].host, "127.0.0.1");
  EXPECT_EQ(nodes[0].port, 5002);
  EXPECT_DOUBLE_EQ(nodes[0].ram_gb, 8);
  EXPECT_DOUBLE_EQ(nodes[0].bandwidth_mbps, 20);
  ASSERT_TRUE(nodes[0].compute.has_value());
  EXPECT_DOUBLE_EQ(*nodes[0].compute, 3.5);
  EXPECT_EQ(nodes[1].name, "node_10");
  EXPECT_FALSE(nodes[1].compute.has_value());
}

TEST(NodeConfigs, ParsesGpus) {
  const auto nodes = parseNodeConfigs(nlohmann::json::parse(R"({
    "0": {"IP": "127.0.0.1:5000", "benchmarks": {"ram": 64, "bandwidth": 50, "compute": 200,
          "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.1, "fp32_tflops": 51,
                    "bf16_tflops": 600, "h2d_gb_per_s": 25, "d2h_gb_per_s": 24},
                   {"name": "second", "memory_gb": 16, "fp32_tflops": 10,
                    "bf16_tflops": 20, "h2d_gb_per_s": 12, "d2h_gb_per_s": 11}]}},
    "1": {"IP": "127.0.0.1:5001", "benchmarks": {"ram": 8, "bandwidth": 50, "gpus": []}},
    "2": {"IP": "127.0.0.1:5002", "benchmarks": {"ram": 8, "bandwidth": 50}}
  })"), "node_configs.json");
  ASSERT_EQ(nodes.size(), 3u);
  ASSERT_EQ(nodes[0].gpus.size(), 2u);
  const GpuFigures& first = nodes[0].gpus[0];  // the one the node trains on
  EXPECT_EQ(first.name, "NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(first.memory_gb, 79.1);
  EXPECT_DOUBLE_EQ(first.fp32_tflops, 51);
  EXPECT_DOUBLE_EQ(first.bf16_tflops, 600);
  EXPECT_DOUBLE_EQ(first.h2d_gb_per_s, 25);
  EXPECT_DOUBLE_EQ(first.d2h_gb_per_s, 24);
  EXPECT_EQ(nodes[0].gpus[1].name, "second");
  EXPECT_DOUBLE_EQ(*nodes[0].compute, 200);  // CPU figures stay next to the GPU's
  EXPECT_TRUE(nodes[1].gpus.empty());        // an empty list: a CPU node
  EXPECT_TRUE(nodes[2].gpus.empty());
}

TEST(NodeConfigs, FileErrorsNameThePath) {
  try {
    readNodeConfigs("/nonexistent/node_configs.json");
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_EQ(std::string(e.what()),
              "/nonexistent/node_configs.json: cannot open (does the file exist and is it readable?)");
  }
}

TEST(NodeConfigs, SyntaxErrorGivesLineAndColumn) {
  const std::string path = ::testing::TempDir() + "/broken_node_configs.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("{\n  \"0\": {\"IP\": \"127.0.0.1:5000\",,}\n}\n", f);
    std::fclose(f);
  }
  try {
    readNodeConfigs(path);
    FAIL();
  } catch (const BadInput& e) {
    EXPECT_EQ(std::string(e.what()), path + ": not valid JSON at line 2 column 32");
  }
}

}  // namespace
}  // namespace cairn
