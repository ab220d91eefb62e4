// Getting the model back: `clusterize --merge` against the pipeline it came from (each node's
// trained_stage.pt run in sequence), the element-wise mean over clusters computed here from the
// trained files, an independent Python reader of the safetensors output, `--weights` against a
// file and reference model written by Python, and the exact messages of bad inputs.
//
// Training itself is the trainer's; these tests stand in for it by writing trained_stage.pt files whose
// values differ from stage.pt and between clusters (see fakeTraining).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "TestModels.h"
#include "clusterize/InitialWeights.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/NodeData.h"
#include "core/Safetensors.h"

namespace cairn::clusterize {
namespace {

namespace fs = std::filesystem;
using testing::runClusterize;

std::string python(const std::string& script) {
  return "/usr/bin/python3 " + testing::sourceDirectory() + "/" + script;
}

// Nodes of a node_data folder in cluster, then pipeline, order.
std::vector<std::vector<std::string>> chains(const std::string& node_data) {
  std::vector<std::vector<std::string>> out;
  const nlohmann::json plan = readJsonFile(node_data + "/plan.json");
  for (const auto& cluster : plan.at("clusters"))
    out.push_back(cluster.at("chain").get<std::vector<std::string>>());
  return out;
}

std::vector<std::vector<int>> unitRanges(const std::string& node_data) {
  std::vector<std::vector<int>> out;
  const nlohmann::json plan = readJsonFile(node_data + "/plan.json");
  for (const auto& cluster : plan.at("clusters")) {
    std::vector<int> cuts;
    for (const auto& stage : cluster.at("stages")) cuts.push_back(stage.at("units")[1].get<int>());
    out.push_back(cuts);
  }
  return out;
}

// Stands in for training: every node's stage.pt with its floating-point parameters and buffers
// scaled by factors in [0.8, 1.2) (BatchNorm variances stay positive), parameters also shifted,
// and integer buffers set to 10 + 5 × cluster; the noise differs per cluster.
void fakeTraining(const std::string& node_data) {
  const auto all = chains(node_data);
  for (size_t c = 0; c < all.size(); ++c) {
    for (const auto& node : all[c]) {
      torch::jit::Module stage = torch::jit::load(nodeDirectory(node_data, node) + "/stage.pt");
      torch::NoGradGuard no_grad;
      torch::manual_seed(100 + 17 * c);
      std::set<const c10::TensorImpl*> done;  // tied tensors change once
      auto change = [&](const torch::Tensor& t, bool parameter) {
        if (!done.insert(t.unsafeGetTensorImpl()).second) return;
        if (t.is_floating_point()) {
          t.mul_(0.8 + 0.4 * torch::rand(t.sizes()));
          if (parameter) t.add_(0.05 * torch::randn(t.sizes()));
        } else {
          t.fill_(10 + 5 * static_cast<int64_t>(c));
        }
      };
      for (const auto& p : stage.named_parameters(true)) change(p.value, true);
      for (const auto& b : stage.named_buffers(true)) change(b.value, false);
      stage.save(nodeDirectory(node_data, node) + "/trained_stage.pt");
    }
  }
}

// The pipeline of one cluster: its trained stages run in sequence in eval mode.
torch::Tensor runPipeline(const std::string& node_data, const std::vector<std::string>& chain,
                          std::vector<c10::IValue> values) {
  for (const auto& name : chain) {
    const NodeSpec spec = readNodeSpec(nodeSpecPath(node_data, name));
    torch::jit::Module stage =
        torch::jit::load(nodeDirectory(node_data, name) + "/trained_stage.pt");
    stage.eval();
    c10::IValue out = stage.forward(values);
    if (spec.outputs.size() > 1) {
      values = out.toTupleRef().elements().vec();
    } else {
      values = {out};
    }
  }
  return values.at(0).toTensor();
}

torch::Tensor runModel(const std::string& path, const std::vector<c10::IValue>& inputs) {
  torch::jit::Module model = torch::jit::load(path);
  model.eval();
  return model.forward(inputs).toTensor();
}

// Every trained value of cluster c, collected from its trained_stage.pt files.
std::map<std::string, torch::Tensor> trainedValues(const std::string& node_data,
                                                   const std::vector<std::string>& chain) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& name : chain) {
    const torch::jit::Module stage =
        torch::jit::load(nodeDirectory(node_data, name) + "/trained_stage.pt");
    for (const auto& p : stage.named_parameters(true)) out[p.name] = p.value;
    for (const auto& b : stage.named_buffers(true)) out[b.name] = b.value;
  }
  return out;
}

void expectMergeMatchesPipeline(const std::string& model_name, const std::string& plan_flags,
                                const std::vector<double>& ram_gb) {
  const std::string dir = testing::temporaryDirectory("merge_" + model_name);
  const std::string node_data = dir + "/node_data";
  const auto planned = runClusterize("--model " + testing::modelPath(model_name) + " --nodes " +
                                     testing::writeNodes(dir, ram_gb) + " --out " + node_data +
                                     " " + plan_flags + " --profile-runs 1 --clusters 2");
  ASSERT_EQ(planned.code, 0) << planned.output;
  const auto all = chains(node_data);
  ASSERT_EQ(all.size(), 2u);
  const auto cuts = unitRanges(node_data);
  ASSERT_NE(cuts[0], cuts[1]) << "the two clusters should be cut differently:\n" << planned.output;
  fakeTraining(node_data);

  const auto inputs = testing::exampleInputs(model_name, 3);
  torch::NoGradGuard no_grad;
  for (int c = 0; c < 2; ++c) {
    const std::string out = dir + "/cluster" + std::to_string(c) + ".pt";
    const auto merged =
        runClusterize("--merge " + node_data + " --out " + out + " --cluster " + std::to_string(c));
    ASSERT_EQ(merged.code, 0) << merged.output;
    const torch::Tensor expected = runPipeline(node_data, all[c], inputs);
    const torch::Tensor got = runModel(out, inputs);
    ASSERT_EQ(got.sizes(), expected.sizes());
    EXPECT_LE((got - expected).abs().max().item<double>(), 1e-6) << "cluster " << c;
    // The trained values really moved: the original model answers differently.
    EXPECT_GT(
        (runModel(testing::modelPath(model_name), inputs) - expected).abs().max().item<double>(),
        1e-3);
  }

  // Default: the average over both clusters, whichever node held each tensor.
  const std::string averaged = dir + "/averaged.pt";
  const auto merged = runClusterize("--merge " + node_data + " --out " + averaged);
  ASSERT_EQ(merged.code, 0) << merged.output;
  const auto first = trainedValues(node_data, all[0]);
  const auto second = trainedValues(node_data, all[1]);
  const torch::jit::Module model = torch::jit::load(averaged);
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& p : model.named_parameters(true)) state.emplace_back(p.name, p.value);
  for (const auto& b : model.named_buffers(true)) state.emplace_back(b.name, b.value);
  ASSERT_FALSE(state.empty());
  for (const auto& [name, value] : state) {
    ASSERT_TRUE(first.count(name) && second.count(name)) << name;
    const torch::Tensor& a = first.at(name);
    const torch::Tensor& b = second.at(name);
    const torch::Tensor expected =
        a.is_floating_point()
            ? ((a.to(torch::kDouble) + b.to(torch::kDouble)) / 2).to(a.scalar_type())
            : torch::maximum(a, b);
    EXPECT_TRUE(torch::equal(value, expected)) << name;
    EXPECT_FALSE(torch::equal(a, b)) << name << ": the fake training should differ per cluster";
  }
}

TEST(ModelMerge, CnnWithBatchNormMatchesItsPipelineAndAveragesClusters) {
  // 30 MB holds the whole CNN; a 16 or 20 MB node does not: with 3 nodes in 2 clusters, the only
  // plan is the 30 MB node alone and the other two as a 2-stage pipeline, so the clusters are cut
  // differently whatever the profile's timings (with 5 nodes, a loaded machine's profile once
  // paired them into two alike 2-stage clusters).
  expectMergeMatchesPipeline("cnn", "--input-shape 32,1,28,28", {0.030, 0.016, 0.020});
}

TEST(ModelMerge, GptMatchesItsPipelineAndAveragesClusters) {
  // The same for the GPT: clusterize estimates 4.5 MB for it in one stage (2.8 + 1.7 MB cut
  // before its last block), so the 5 MB node holds it alone and the 3.2 and 3.6 MB nodes only
  // together. (Its 5 nodes of 2-4 MB could be paired alike under load, as the CNN's were.)
  expectMergeMatchesPipeline("gpt", "--input-shape 8,16 --input-dtype int64",
                             {0.005, 0.0032, 0.0036});
}

TEST(ModelMerge, SafetensorsReadByAnIndependentReader) {
  const std::string dir = testing::temporaryDirectory("merge_safetensors");
  const std::string node_data = dir + "/node_data";
  // gpt_tied: tok.weight and head.weight are one tensor; both names are written.
  const auto planned =
      runClusterize("--model " + testing::modelPath("gpt_tied") + " --nodes " +
                    testing::writeNodes(dir, 2, 0.01) + " --out " + node_data +
                    " --input-shape 8,16 --input-dtype int64 --profile-runs 1 --clusters 2");
  ASSERT_EQ(planned.code, 0) << planned.output;
  fakeTraining(node_data);
  auto r = runClusterize("--merge " + node_data + " --out " + dir + "/trained.pt");
  ASSERT_EQ(r.code, 0) << r.output;
  r = runClusterize("--merge " + node_data + " --out " + dir +
                    "/trained.safetensors --format safetensors");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string check =
      python("safetensors_reader.py") + " " + dir + "/trained.safetensors " + dir + "/trained.pt";
  EXPECT_EQ(std::system(check.c_str()), 0) << check;

  // The tie survives the merge.
  const torch::jit::Module merged = torch::jit::load(dir + "/trained.pt");
  EXPECT_EQ(merged.attr("tok").toModule().attr("weight").toTensor().data_ptr(),
            merged.attr("head").toModule().attr("weight").toTensor().data_ptr());
  // Without --out: next to the node data.
  r = runClusterize("--merge " + node_data + " --format safetensors --cluster 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(node_data + "/trained.safetensors")) << r.output;
}

TEST(ModelMerge, BadTrainedFilesExitTwoNamingNodeFileAndTensor) {
  const std::string dir = testing::temporaryDirectory("merge_bad");
  const std::string node_data = dir + "/node_data";
  const auto planned =
      runClusterize("--model " + testing::modelPath("cnn") + " --nodes " +
                    testing::writeNodes(dir, {0.030, 0.012, 0.016, 0.020, 0.018}) + " --out " +
                    node_data + " --input-shape 32,1,28,28 --profile-runs 1 --clusters 2");
  ASSERT_EQ(planned.code, 0) << planned.output;
  fakeTraining(node_data);
  const auto all = chains(node_data);
  const int multi = all[0].size() > 1 ? 0 : 1;  // a cluster with two or more stages
  ASSERT_GE(all[multi].size(), 2u);
  const std::string leaf = all[multi].back();
  const std::string leaf_file = nodeDirectory(node_data, leaf) + "/trained_stage.pt";
  const std::string where = "node " + leaf + " (cluster " + std::to_string(multi) + ", stage " +
                            std::to_string(all[multi].size() - 1) + ")";
  const std::string out = " --out " + dir + "/trained.pt";

  fs::rename(leaf_file, leaf_file + ".away");
  auto r = runClusterize("--merge " + node_data + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output, "clusterize: error: " + leaf_file + ": missing: " + where +
                          " has no trained weights (run its provider to the end, or merge one "
                          "--cluster that finished)\n");
  // The other cluster alone still merges.
  r = runClusterize("--merge " + node_data + out + " --cluster " + std::to_string(1 - multi));
  EXPECT_EQ(r.code, 0) << r.output;

  // An extra tensor.
  torch::jit::Module stage = torch::jit::load(leaf_file + ".away");
  stage.register_parameter("stray", torch::zeros({3}), false);
  stage.save(leaf_file);
  r = runClusterize("--merge " + node_data + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output, "clusterize: error: " + leaf_file + ": " + where +
                          ": tensor \"stray\" is not one of the stage's parameters or buffers in "
                          "plan.json\n");

  // A parameter with the wrong shape: the leaf is the CNN's last Linear (13.weight is 10 × 64).
  stage = torch::jit::load(leaf_file + ".away");
  stage.attr("13").toModule().register_parameter("weight", torch::zeros({10, 65}), false);
  stage.save(leaf_file);
  r = runClusterize("--merge " + node_data + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output,
            "clusterize: error: " + leaf_file + ": " + where +
                ": parameter \"13.weight\" is Float [10, 65] but the model's is Float [10, 64]\n");

  // A missing parameter (the stage from another layer range has no 13.bias).
  fs::copy_file(nodeDirectory(node_data, all[multi].front()) + "/trained_stage.pt", leaf_file,
                fs::copy_options::overwrite_existing);
  r = runClusterize("--merge " + node_data + out);
  EXPECT_EQ(r.code, 2) << r.output;
  const NodeSpec spec = readNodeSpec(nodeSpecPath(node_data, leaf));
  EXPECT_EQ(r.output, "clusterize: error: " + leaf_file + ": " + where + ": parameter \"" +
                          spec.parameters.front() + "\" is missing\n");

  fs::rename(leaf_file + ".away", leaf_file);
  r = runClusterize("--merge " + node_data + out + " --cluster 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output,
            "clusterize: error: --cluster 2: " + node_data + "/plan.json has clusters 0..1\n");
  r = runClusterize("--merge " + node_data + out + " --format onnx");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output,
            "clusterize: error: --format must be torchscript or safetensors (got \"onnx\")\n");
  r = runClusterize("--merge " + node_data + out + " --input-shape 3,4");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output,
            "clusterize: error: --merge takes only --out, --format, --cluster and --model (got "
            "--input-shape)\n");
  r = runClusterize("--merge " + node_data + out + " --model " + dir + "/nothing.pt");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(r.output,
            "clusterize: error: " + dir + "/nothing.pt: the original model is missing (--model)\n");
}

TEST(InitialWeights, StagesStartFromTheFileValues) {
  const std::string dir = testing::temporaryDirectory("weights");
  for (const std::string name : {"cnn", "gpt_tied"}) {
    const std::string weights = dir + "/" + name + ".safetensors";
    const std::string reference = dir + "/" + name + "_reference.pt";
    const std::string command = python("write_weights.py") + " " + testing::modelPath(name) + " " +
                                weights + " " + reference;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    const std::string node_data = dir + "/" + name + "_node_data";
    const std::string shape =
        name == "cnn" ? "--input-shape 8,1,28,28" : "--input-shape 4,16 --input-dtype int64";
    const auto r = runClusterize("--model " + testing::modelPath(name) + " --weights " + weights +
                                 " --nodes " + testing::writeNodes(dir, 3, 0.004) + " --out " +
                                 node_data + " " + shape + " --profile-runs 1 --clusters 1");
    ASSERT_EQ(r.code, 0) << r.output;

    std::map<std::string, torch::Tensor> expected;
    const torch::jit::Module ref = torch::jit::load(reference);
    for (const auto& p : ref.named_parameters(true)) expected[p.name] = p.value;
    for (const auto& b : ref.named_buffers(true)) expected[b.name] = b.value;
    size_t compared = 0;
    const auto chain = chains(node_data).at(0);
    for (const auto& node : chain) {
      const torch::jit::Module stage =
          torch::jit::load(nodeDirectory(node_data, node) + "/stage.pt");
      for (const auto& p : stage.named_parameters(true)) {
        EXPECT_TRUE(torch::equal(p.value, expected.at(p.name))) << name << ": " << p.name;
        ++compared;
      }
      for (const auto& b : stage.named_buffers(true)) {
        EXPECT_TRUE(torch::equal(b.value, expected.at(b.name))) << name << ": " << b.name;
        ++compared;
      }
    }
    EXPECT_EQ(compared, expected.size()) << name;
  }
}

TEST(InitialWeights, EveryMismatchIsListedByName) {
  const std::string dir = testing::temporaryDirectory("weights_bad");
  const torch::jit::Module model = torch::jit::load(testing::modelPath("cnn"));
  NamedTensors tensors;
  for (const auto& p : model.named_parameters(true)) tensors.emplace_back(p.name, p.value.clone());
  for (const auto& b : model.named_buffers(true)) tensors.emplace_back(b.name, b.value.clone());
  NamedTensors bad;
  for (const auto& [name, t] : tensors) {
    if (name == "13.bias" || name == "5.running_var") continue;  // missing in file
    if (name == "4.weight") {
      bad.emplace_back(name, torch::zeros({16, 8, 5, 5}));  // shape
    } else if (name == "1.running_mean") {
      bad.emplace_back(name, t.to(torch::kDouble));  // dtype
    } else {
      bad.emplace_back(name, t);
    }
  }
  bad.emplace_back("14.weight", torch::zeros({2, 2}));  // unknown name
  const std::string file = dir + "/bad.safetensors";
  writeSafetensors(file, bad);
  const std::string nodes = testing::writeNodes(dir, 2, 0.1);
  const auto r =
      runClusterize("--model " + testing::modelPath("cnn") + " --weights " + file + " --nodes " +
                    nodes + " --out " + dir + "/out --input-shape 8,1,28,28");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_EQ(
      r.output,
      "clusterize: error: " + file + " does not fit " + testing::modelPath("cnn") +
          " (5 mismatches):\n"
          "  missing in file: \"13.bias\" (the model's is F32 [10])\n"
          "  missing in file: \"5.running_var\" (the model's is F32 [16])\n"
          "  unknown name: \"14.weight\" (F32 [2, 2]) is not a parameter or buffer of the model\n"
          "  shape: \"4.weight\" is [16, 8, 5, 5] in the file, [16, 8, 3, 3] in the model\n"
          "  dtype: \"1.running_mean\" is F64 in the file, F32 in the model\n");
  EXPECT_FALSE(fs::exists(dir + "/out/plan.json"));
}

TEST(InitialWeights, TiedTensorsNeedOneNameAndMustAgree) {
  torch::jit::Module model = torch::jit::load(testing::modelPath("gpt_tied"));
  NamedTensors tensors;
  for (const auto& p : model.named_parameters(true))
    if (p.name != "head.weight") tensors.emplace_back(p.name, torch::ones_like(p.value));
  for (const auto& b : model.named_buffers(true)) tensors.emplace_back(b.name, b.value.clone());
  const std::string dir = testing::temporaryDirectory("weights_tied");
  writeSafetensors(dir + "/one_name.safetensors", tensors);
  loadInitialWeights(model, dir + "/one_name.safetensors", "gpt_tied.pt");
  const torch::Tensor head = model.attr("head").toModule().attr("weight").toTensor();
  EXPECT_TRUE(torch::equal(head, torch::ones_like(head)));

  tensors.emplace_back("head.weight", torch::zeros_like(head));
  writeSafetensors(dir + "/disagree.safetensors", tensors);
  try {
    loadInitialWeights(model, dir + "/disagree.safetensors", "gpt_tied.pt");
    FAIL() << "expected BadInput";
  } catch (const BadInput& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tied: \""), std::string::npos) << what;
    EXPECT_NE(what.find("are one tensor in the model but differ in the file"), std::string::npos)
        << what;
    EXPECT_NE(what.find("\"head.weight\""), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace cairn::clusterize
