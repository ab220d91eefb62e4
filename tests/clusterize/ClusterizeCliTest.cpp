// The clusterize binary end to end: node_data that core's readers accept, stages that Debian's
// Python torch loads and chains to the model's output, re-runs that keep foreign files, and clear
// exit-2 messages for infeasible inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "TestModels.h"
#include "core/CurveKeys.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"

namespace cairn::clusterize {
namespace {

namespace fs = std::filesystem;

using testing::CliRun;
using testing::writeNodes;
CliRun run(const std::string& arguments) { return testing::runClusterize(arguments); }

TEST(ClusterizeCli, WritesNodeDataThatCoreAndPythonAccept) {
  const std::string dir = testing::temporaryDirectory("cli");
  const std::string out = dir + "/node_data";
  // 12 MB nodes: the CNN with 4 micro-batches of 32 (~20 MB estimated, its largest unit ~9 MB)
  // needs two or more per cluster.
  const std::string nodes = writeNodes(dir, 7, 0.012);
  const CliRun r = run("--model " + testing::modelPath("cnn") + " --nodes " + nodes + " --out " + out +
                    " --input-shape 32,1,28,28 --microbatches 4 --profile-runs 1 --seed 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("cluster 0: node_"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\u2192"), std::string::npos) << "expected a multi-stage chain:\n" << r.output;

  const nlohmann::json plan = readJsonFile(out + "/plan.json");
  readJobSpec(out + "/job.json");
  int placed = 0;
  for (const auto& cluster : plan.at("clusters")) {
    const auto& stages = cluster.at("stages");
    ASSERT_GE(stages.size(), 2u);
    for (size_t s = 0; s < stages.size(); ++s) {
      const std::string name = stages[s].at("node");
      const NodeSpec node = readNodeSpec(nodeSpecPath(out, name));  // core's validation
      ++placed;
      EXPECT_EQ(node.stage, static_cast<int>(s));
      EXPECT_EQ(node.num_stages, static_cast<int>(stages.size()));
      if (s > 0) {
        EXPECT_EQ(node.upstream->name, stages[s - 1].at("node").get<std::string>());
      }
      if (s + 1 < stages.size()) {
        EXPECT_EQ(node.downstream->name, stages[s + 1].at("node").get<std::string>());
      }
      EXPECT_TRUE(fs::exists(nodeDirectory(out, name) + "/stage.pt"));
      // CURVE: the secret only in the node's folder, owner-only; neighbours know its public key.
      const std::string key_file = nodeDirectory(out, name) + "/secret.key";
      EXPECT_EQ(fs::status(key_file).permissions() & fs::perms::mask, fs::perms::owner_read | fs::perms::owner_write);
      const CurveKeyPair keys = readKeyFile(key_file);
      EXPECT_EQ(node.extra.at("public_key").get<std::string>(), keys.public_key);
      if (s > 0) {
        const NodeSpec up = readNodeSpec(nodeSpecPath(out, node.upstream->name));
        EXPECT_EQ(up.downstream->public_key, keys.public_key);
        EXPECT_TRUE(isZ85Key(node.upstream->public_key));
      }
      for (const auto& ring : node.rings) {
        EXPECT_EQ(ring.members.size(), plan.at("clusters").size());
        EXPECT_EQ(ring.members[ring.rank].name, name);
      }
    }
  }
  EXPECT_EQ(placed + static_cast<int>(plan.at("spare_nodes").size()), 7);

  const std::string check = "/usr/bin/python3 " + testing::sourceDirectory() + "/check_stages.py " +
                            out + " " + testing::modelPath("cnn") + " float:5,1,28,28";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;

  // Re-run on nodes 0..2 only: foreign files stay, files clusterize wrote for nodes 3..6 go, and so
  // do their folders unless something else lives there.
  std::vector<std::string> gone;
  for (int i = 3; i < 7; ++i)
    if (fs::exists(out + "/nodes/node_" + std::to_string(i))) gone.push_back("node_" + std::to_string(i));
  ASSERT_GE(gone.size(), 2u);
  std::ofstream(out + "/nodes/" + gone[0] + "/notes.txt") << "mine";
  std::ofstream(out + "/README.md") << "mine";
  const std::string fewer = writeNodes(dir, 3, 1.0);
  const CliRun again = run("--model " + testing::modelPath("cnn") + " --nodes " + fewer + " --out " +
                           out + " --input-shape 32,1,28,28 --profile-runs 1");
  ASSERT_EQ(again.code, 0) << again.output;
  EXPECT_TRUE(fs::exists(out + "/README.md"));
  EXPECT_TRUE(fs::exists(out + "/nodes/" + gone[0] + "/notes.txt"));
  EXPECT_FALSE(fs::exists(out + "/nodes/" + gone[0] + "/node.json"));
  EXPECT_FALSE(fs::exists(out + "/nodes/" + gone[1]));
  EXPECT_TRUE(fs::exists(out + "/nodes/node_0/stage.pt"));
}

TEST(ClusterizeCli, GptAndTwoInputModelsLoadInPython) {
  const std::string dir = testing::temporaryDirectory("cli_more");
  const std::string nodes = writeNodes(dir, 4, 0.002);
  CliRun r = run("--model " + testing::modelPath("gpt") + " --nodes " + nodes + " --out " + dir +
              "/gpt --input-shape 8,16 --input-dtype int64 --profile-runs 1 --clusters 1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::string check = "/usr/bin/python3 " + testing::sourceDirectory() + "/check_stages.py " + dir +
                      "/gpt " + testing::modelPath("gpt") + " ids50:3,12";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  r = run("--model " + testing::modelPath("two_input") + " --nodes " + nodes + " --out " + dir +
          "/two --input-shape 8,12 --input-shape 8,6 --profile-runs 1 --clusters 2");
  ASSERT_EQ(r.code, 0) << r.output;
  check = "/usr/bin/python3 " + testing::sourceDirectory() + "/check_stages.py " + dir + "/two " +
          testing::modelPath("two_input") + " float:3,12 float:3,6";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
}

// --cuts fixes the stage boundaries: whatever the profiled timings, every cluster has exactly the
// stages asked for, and they still chain to the model's output in Python (check_stages.py).
TEST(ClusterizeCli, FixedCutsAreTakenAsGiven) {
  const std::string dir = testing::temporaryDirectory("cli_cuts");
  const std::string nodes = writeNodes(dir, 9, 1.0);
  const std::string base = " --model " + testing::modelPath("cnn") +
                           " --input-shape 32,1,28,28 --profile-runs 1";
  const std::string model = base + " --nodes " + nodes;
  // The valid cuts, as ModelGraph reports them in a planner-chosen plan.
  CliRun r = run(model + " --out " + dir + "/free --clusters 1");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<int> valid;
  const nlohmann::json units = readJsonFile(dir + "/free/plan.json").at("units");
  for (const auto& u : units)
    if (u.at("cut_before_allowed").get<bool>() && u.at("index").get<int>() > 0)
      valid.push_back(u.at("index").get<int>());
  ASSERT_GE(valid.size(), 3u) << "the CNN should have several places to cut";
  const int total = static_cast<int>(units.size());
  // First, middle and last valid cut: 4 stages per cluster, 2 clusters on 9 nodes (one spare).
  const std::vector<int> cuts = {valid.front(), valid[valid.size() / 2], valid.back()};
  r = run(model + " --out " + dir + "/fixed --clusters 2 --cuts " + std::to_string(cuts[0]) + "," +
          std::to_string(cuts[1]) + "," + std::to_string(cuts[2]));
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json plan = readJsonFile(dir + "/fixed/plan.json");
  ASSERT_EQ(plan.at("clusters").size(), 2u);
  const std::vector<int> bounds = {0, cuts[0], cuts[1], cuts[2], total};
  for (const auto& cluster : plan.at("clusters")) {
    const auto& stages = cluster.at("stages");
    ASSERT_EQ(stages.size(), 4u) << plan.dump(2);
    for (size_t s = 0; s < stages.size(); ++s) {
      EXPECT_EQ(stages[s].at("units")[0].get<int>(), bounds[s]);
      EXPECT_EQ(stages[s].at("units")[1].get<int>(), bounds[s + 1]);
    }
  }
  EXPECT_EQ(plan.at("spare_nodes").size(), 1u);
  const std::string check = "/usr/bin/python3 " + testing::sourceDirectory() + "/check_stages.py " +
                            dir + "/fixed " + testing::modelPath("cnn") + " float:5,1,28,28";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;

  // Bad cuts: exit 2, naming the flag and the unit.
  r = run(model + " --out " + dir + "/bad --cuts " + std::to_string(cuts[1]) + "," +
          std::to_string(cuts[0]));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--cuts " + std::to_string(cuts[0]) + ": cuts must be strictly increasing"),
            std::string::npos) << r.output;
  r = run(model + " --out " + dir + "/bad --cuts " + std::to_string(total));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--cuts " + std::to_string(total)), std::string::npos) << r.output;
  r = run(base + " --out " + dir + "/bad --clusters 2 --cuts " + std::to_string(cuts[0]) + "," +
          std::to_string(cuts[1]) + "," + std::to_string(cuts[2]) + " --nodes " + writeNodes(dir, 5, 1.0));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--cuts makes 4 stages per cluster, so 2 cluster(s) need 8 nodes"),
            std::string::npos) << r.output;
  for (int u = 1; u < total; ++u)
    if (!units[u].at("cut_before_allowed").get<bool>()) {
      r = run(model + " --out " + dir + "/bad --cuts " + std::to_string(u));
      EXPECT_EQ(r.code, 2) << r.output;
      EXPECT_NE(r.output.find("--cuts " + std::to_string(u) + ": the model cannot be cut before unit"),
                std::string::npos) << r.output;
      break;
    }
  EXPECT_FALSE(fs::exists(dir + "/bad/plan.json"));
}

// The time estimate counts what a stage sends in the form it travels: with the job's
// wire.activations each float32 boundary value is 4, 2, or (int8) 1 byte a value plus 4 bytes a
// row — recomputed here from the plan's own boundary shapes.
TEST(ClusterizeCli, SentBytesFollowTheWireCodec) {
  const std::string dir = testing::temporaryDirectory("cli_wire");
  const std::string nodes = writeNodes(dir, 3, 1.0);
  auto bytesOf = [](const nlohmann::json& values, const std::string& codec) {
    double total = 0;
    for (const auto& v : values) {
      const auto shape = v.at("shape").get<std::vector<int64_t>>();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      if (v.at("dtype") != "float32") {
        ADD_FAILURE() << "the CNN's boundaries are float32: " << v.dump();
        continue;
      }
      if (codec == "fp32") total += 4.0 * n;
      else if (codec == "bf16" || codec == "fp16") total += 2.0 * n;
      else if (shape.size() == 2) total += n + 4.0 * shape[0];             // a row per sample
      else total += n + 4.0 * double(shape[0]) * double(shape[1]);         // per sample and channel
    }
    return total;
  };
  std::vector<double> fp32_sent;
  for (const std::string codec : {"fp32", "bf16", "int8"}) {
    nlohmann::json job = {{"format", 1},
                          {"job_id", "wire"},
                          {"data", {{"location", "/usr/share/datasets/fashion-mnist"}, {"format", "idx"}}},
                          {"training_definition",
                           {{"batch_size", 64}, {"microbatches", 2}, {"wire", {{"activations", codec}}}}}};
    std::ofstream(dir + "/job_" + codec + ".json") << job.dump();
    // Fixed cuts (after the first convolution block and before the classifier), so both runs
    // have the same boundaries whatever the timing.
    const CliRun r = run("--model " + testing::modelPath("cnn") + " --input-shape 32,1,28,28" +
                         " --profile-runs 1 --clusters 1 --cuts 4,10 --nodes " + nodes + " --job " +
                         dir + "/job_" + codec + ".json --out " + dir + "/" + codec);
    ASSERT_EQ(r.code, 0) << r.output;
    const nlohmann::json plan = readJsonFile(dir + "/" + codec + "/plan.json");
    EXPECT_EQ(plan.at("wire_activations"), codec);
    const auto& stages = plan.at("clusters").at(0).at("stages");
    ASSERT_EQ(stages.size(), 3u);
    for (size_t s = 0; s < stages.size(); ++s) {
      double expected = 0;
      if (s > 0) expected += bytesOf(stages[s].at("inputs"), codec);
      if (s + 1 < stages.size()) expected += bytesOf(stages[s].at("outputs"), codec);
      EXPECT_DOUBLE_EQ(stages[s].at("sent_bytes_per_microbatch").get<double>(), expected)
          << codec << " stage " << s;
      if (codec == "fp32") fp32_sent.push_back(expected);
      else EXPECT_LT(expected, fp32_sent.at(s) * (codec == "bf16" ? 0.51 : 0.3) + 1) << codec << " stage " << s;
    }
  }
}

// With a GPU node the plan says which plan it took over which and the yardstick it used; which one
// wins here depends on profiled times, so only the record's consistency is checked (the choice
// itself: GpuPlanTest, on fixed costs).
TEST(ClusterizeCli, GpuNodesRecordTheChoiceAndTheHostFigure) {
  const std::string dir = testing::temporaryDirectory("cli_gpu");
  nlohmann::json nodes = nlohmann::json::object();
  const nlohmann::json gpu = {{"name", "Test GPU"}, {"memory_gb", 24}, {"fp32_tflops", 80},
                              {"bf16_tflops", 160}, {"h2d_gb_per_s", 25}, {"d2h_gb_per_s", 25}};
  for (int i = 0; i < 4; ++i) {
    nlohmann::json bench = {{"ram", i < 2 ? 32 : 0.06}, {"bandwidth", 50}, {"compute", 100}};
    if (i < 2) bench["gpus"] = nlohmann::json::array({gpu});
    nodes[std::to_string(i)] = {{"IP", "127.0.0.1:" + std::to_string(6300 + i)}, {"benchmarks", bench}};
  }
  writeJsonFile(dir + "/nodes.json", nodes);
  const std::string args = "--model " + testing::modelPath("cnn") + " --nodes " + dir +
                           "/nodes.json --input-shape 32,1,28,28 --profile-runs 1 --out " + dir + "/out";
  CliRun r = run(args + " --host-gflops 0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--host-gflops"), std::string::npos) << r.output;

  r = run(args + " --host-gflops 100");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("this host's 100.0 GFLOPS (--host-gflops)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("plan: "), std::string::npos) << r.output;
  const nlohmann::json plan = readJsonFile(dir + "/out/plan.json");
  const nlohmann::json& g = plan.at("gpu_plan");
  EXPECT_EQ(g.at("host_gflops").get<double>(), 100);
  EXPECT_EQ(g.at("host_gflops_source"), "--host-gflops");
  EXPECT_EQ(g.at("precision"), "fp32");
  ASSERT_FALSE(g.at("whole_model_per_gpu").is_null());  // the GPUs hold the model
  const double cut = g.at("cut").at("microbatches_per_s"), whole = g.at("whole_model_per_gpu").at("microbatches_per_s");
  EXPECT_EQ(g.at("chosen"), whole >= cut ? "whole_model_per_gpu" : "cut");
  EXPECT_DOUBLE_EQ(g.at("cut").at("samples_per_s").get<double>(), 32 * cut);
  for (const auto& cluster : plan.at("clusters"))
    for (const auto& stage : cluster.at("stages")) {
      const bool on_gpu = stage.at("node") == "node_0" || stage.at("node") == "node_1";
      EXPECT_EQ(stage.contains("gpu"), on_gpu) << stage.at("node");
      if (on_gpu) {
        EXPECT_EQ(stage.at("gpu"), "Test GPU");
      }
    }
}

TEST(ClusterizeCli, InfeasibleInputsExitTwoWithTheReason) {
  const std::string dir = testing::temporaryDirectory("cli_bad");
  const std::string model = " --model " + testing::modelPath("cnn") + " --input-shape 32,1,28,28 --profile-runs 1 --out " + dir + "/out";
  writeJsonFile(dir + "/empty.json", nlohmann::json::object());
  CliRun r = run("--nodes " + dir + "/empty.json" + model);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("empty.json: no nodes"), std::string::npos) << r.output;

  // The small GPT needs ~4.5 MB in all, ~1.5 MB for its largest block.
  r = run("--nodes " + writeNodes(dir, 2, 0.0018) + " --model " + testing::modelPath("gpt") +
          " --input-shape 8,16 --input-dtype int64 --profile-runs 1 --out " + dir + "/out");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("but all 2 nodes together have 0.0036 GB: short by 0.00"), std::string::npos)
      << r.output;

  r = run("--nodes " + writeNodes(dir, 60, 0.004) + model);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("as a stage of its own but the largest node (node_"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/out/plan.json"));
}

}  // namespace
}  // namespace cairn::clusterize
