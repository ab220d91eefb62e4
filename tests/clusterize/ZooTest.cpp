// Issue [R]: every cut clusterize allows trains. For each model of a zoo (tests/clusterize/
// make_zoo.py: CNN, ResNet block, GPT with learned positions, GPT with tied embeddings, GPT with
// rotary tables and an explicit bool causal mask, a GPT whose int64 positions and bool mask cross
// its cuts, a model with parameter-free first and last units, a model with two inputs), the
// model is profiled once (clusterize's prepareModel) and planned at every cut ModelGraph allows
// into 2 stages (12 drawn with a fixed seed when it allows more) and at 3 three-stage cuts drawn
// with a fixed seed (planNodes with the cuts fixed, as `clusterize --cuts` plans). Each plan is
// written as node_data and trained for 3 SGD-with-momentum steps of 2 micro-batches by real
// providers (runProvider, as `provider --name` runs it, one thread each: their own ZeroMQ
// transports on loopback, so every boundary tensor is encoded, validated against the plan and
// decoded), and `clusterize --merge`'s merge gives the trained model back.
//
// Reference: the unsplit TorchScript model trained in this process by hand on the batches the
// Root recorded (sample_ids.jsonl): each micro-batch's summed cross entropy over the batch's
// target count, backward per micro-batch, then PyTorch's SGD with momentum written out (no
// cairn code). A plan that does not train (a provider throws, a tensor is dropped, a neighbour
// waits until the peer timeout) or trains anything else fails the case, naming the cut.
//
// Tolerances, from what is compared: the step losses are float32 sums of 8..80 cross-entropy
// terms of ~2..4 (ulp ~2.4e-7 relative) over the same kernels run stage by stage instead of
// whole, and the same micro-batches in the same order; what differs is where autograd sums a
// gradient (a value used on both sides of a cut gets its two contributions added by the stage
// that produced it, not inside one graph): a few ulps per step, amplified by 3 momentum steps of
// lr 0.05. 1e-5 relative for the losses is ~40 ulps; the same, relative to max(1, |value|), for
// every trained parameter and floating-point buffer (BatchNorm statistics); integer buffers
// (num_batches_tracked) exactly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "TestModels.h"
#include "clusterize/Clusterize.h"
#include "clusterize/ModelMerge.h"
#include "clusterize/NodeDataWriter.h"
#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/NodeConfigs.h"
#include "core/Safetensors.h"
#include "node/pipeline/ProviderRun.h"
#include "tests/common/LoopbackPorts.h"

namespace cairn::clusterize {
namespace {

constexpr double kZooTolerance = 1e-5;

struct ZooModel {
  std::string name;
  std::string folder;
  std::vector<std::string> inputs;  // the data file's tensors fed to forward, in order
  std::vector<std::string> shapes;  // one micro-batch, clusterize's --input-shape
  std::vector<std::string> dtypes;
};

// The zoo's folder: CAIRN_ZOO_DIR (ctest's clusterize.make_zoo fixture writes it once for every
// model's process), else make_zoo.py run into a temporary folder.
const std::string& zooDirectory() {
  static const std::string dir = [] {
    if (const char* given = std::getenv("CAIRN_ZOO_DIR")) return std::string(given);
    const std::string out = testing::temporaryDirectory("zoo");
    const std::string command =
        "/usr/bin/python3 " + testing::sourceDirectory() + "/make_zoo.py " + out;
    if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
    return out;
  }();
  return dir;
}

ZooModel zooModel(const std::string& name) {
  for (const auto& entry : readJsonFile(zooDirectory() + "/zoo.json")) {
    if (entry.at("name") != name) continue;
    using Names = std::vector<std::string>;
    return {name, entry.at("folder").get<std::string>(), entry.at("inputs").get<Names>(),
            entry.at("input_shapes").get<Names>(), entry.at("input_dtypes").get<Names>()};
  }
  throw std::runtime_error("zoo.json has no model " + name);
}

// The numbers of make_zoo.py's job.json the reference repeats.
struct ZooJob {
  int64_t microbatches = 0;
  double lr = 0;
  double momentum = 0;
};

ZooJob zooJob(const ZooModel& m) {
  const nlohmann::json training = readJsonFile(m.folder + "/job.json").at("training_definition");
  return {training.at("microbatches").get<int64_t>(),
          training.at("optimizer").at("lr").get<double>(),
          training.at("optimizer").at("momentum").get<double>()};
}

using Batches = std::vector<std::vector<int64_t>>;  // sample ids per step
using State = std::map<std::string, at::Tensor>;    // parameters and buffers by dotted name

struct Trained {
  Batches batches;
  std::vector<double> losses;
  State state;
};

at::Tensor crossEntropySum(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor flat = logits.reshape({-1, logits.size(-1)});
  return -at::log_softmax(flat, 1).gather(1, targets.reshape({-1, 1})).sum();
}

// The unsplit model trained on `batches` as the providers train it (the file's header).
Trained trainWhole(const ZooModel& m, const Batches& batches) {
  const ZooJob job = zooJob(m);
  torch::jit::Module model = torch::jit::load(m.folder + "/model.pt");
  model.train();
  State data;
  for (auto& [name, tensor] : readSafetensors(m.folder + "/data.safetensors")) data[name] = tensor;
  // A tied weight is one tensor under two names: stepped once.
  std::vector<at::Tensor> params;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : model.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
  std::vector<at::Tensor> velocity(params.size());
  Trained ref;
  ref.batches = batches;
  for (const auto& step_ids : batches) {
    for (auto& p : params) p.mutable_grad() = at::Tensor();
    const at::Tensor ids = at::tensor(step_ids, at::kLong);
    const int64_t terms = data.at("targets").index_select(0, ids).numel();
    double total = 0;
    for (const at::Tensor& rows : ids.chunk(job.microbatches)) {
      std::vector<c10::IValue> inputs;
      for (const auto& name : m.inputs) inputs.emplace_back(data.at(name).index_select(0, rows));
      const at::Tensor out = model.forward(inputs).toTensor();
      const at::Tensor loss =
          crossEntropySum(out, data.at("targets").index_select(0, rows)) / double(terms);
      loss.backward();
      total += loss.item<double>();
    }
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& grad = params[i].grad();
      if (!grad.defined()) continue;
      velocity[i] =
          velocity[i].defined() ? velocity[i].mul_(job.momentum).add_(grad) : grad.clone();
      params[i].sub_(velocity[i] * job.lr);
    }
    ref.losses.push_back(total);
  }
  for (const auto& p : model.named_parameters()) ref.state[p.name] = p.value.detach().clone();
  for (const auto& b : model.named_buffers()) ref.state[b.name] = b.value.detach().clone();
  return ref;
}

std::string zooCutsText(const std::vector<int>& cuts) {
  std::string s;
  for (int c : cuts) s += (s.empty() ? "" : ",") + std::to_string(c);
  return "cuts {" + s + "}";
}

std::vector<nlohmann::json> jsonLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": missing");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// Plans `prepared` at `cuts` (one cluster), writes node_data under `work`, trains it with one
// provider per stage (threads of this process) and merges the trained stages.
Trained trainCut(const PreparedModel& prepared, const ZooModel& m, const std::vector<int>& cuts,
                 const std::string& work) {
  const int stages = int(cuts.size()) + 1;
  nlohmann::json configs = nlohmann::json::object();
  const std::vector<int> ports = testutil::freeLoopbackPorts(stages);
  for (int i = 0; i < stages; ++i)
    configs[std::to_string(i)] = {{"IP", "127.0.0.1:" + std::to_string(ports[size_t(i)])},
                                  {"benchmarks", {{"ram", 1}, {"bandwidth", 1000}}}};
  const std::string nodes_path = work + "/node_configs.json";
  writeJsonFile(nodes_path, configs);
  PreparedModel at_cuts = prepared;
  at_cuts.settings.cuts = cuts;
  const ClusterizeResult plan = planNodes(at_cuts, readNodeConfigs(nodes_path), nodes_path);
  if (plan.plan.clusters.size() != 1 || plan.plan.clusters[0].stages.size() != size_t(stages))
    throw std::runtime_error("the plan is not one cluster of " + std::to_string(stages) +
                             " stages");
  const std::string node_data = work + "/node_data";
  NodeDataWriter(node_data).write(plan.plan, plan.job, plan.nodes, plan.stages);

  std::vector<std::string> chain(size_t(stages), "");
  for (const NodeSpec& node : plan.nodes) chain.at(size_t(node.stage)) = node.name;
  std::vector<std::string> errors(chain.size());
  std::vector<std::thread> providers;
  for (size_t s = 0; s < chain.size(); ++s)
    providers.emplace_back([&, s] {
      try {
        ProviderRunOptions options;
        options.node_data = node_data;
        options.name = chain[s];
        options.device = "cpu";
        runProvider(options);
      } catch (const std::exception& e) {
        errors[s] = chain[s] + ": " + e.what();
      }
    });
  for (auto& t : providers) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  for (const auto& name : chain) {
    const nlohmann::json transport =
        readJsonFile(nodeDirectory(node_data, name) + "/result.json").at("transport");
    if (transport.at("messages_dropped") != 0 || !transport.at("pipeline_dropped").empty())
      throw std::runtime_error(name + " dropped messages: " + transport.dump());
  }

  Trained trained;
  const std::string root = nodeDirectory(node_data, chain[0]);
  for (const auto& record : jsonLines(root + "/sample_ids.jsonl"))
    trained.batches.push_back(record.at("ids").get<std::vector<int64_t>>());
  for (const auto& record : jsonLines(root + "/metrics.jsonl"))
    if (record.contains("step") && record.contains("loss"))
      trained.losses.push_back(record.at("loss").get<double>());
  MergeOptions merge;
  merge.node_data = node_data;
  merge.model_path = m.folder + "/model.pt";
  for (auto& [name, tensor] : mergeTrainedStages(merge).state) trained.state[name] = tensor;
  return trained;
}

double relativeError(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes()) return 1e30;
  const at::Tensor a = got.to(at::kDouble), b = want.to(at::kDouble);
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

// Worst relative error of `got` against `want` (the reference); a failure names the cut.
double expectTrainedAlike(const Trained& got, const Trained& want, const std::string& what) {
  double worst = 0;
  EXPECT_EQ(got.losses.size(), want.losses.size()) << what << ": step losses";
  for (size_t i = 0; i < std::min(got.losses.size(), want.losses.size()); ++i) {
    const double err = std::abs(got.losses[i] - want.losses[i]) / std::abs(want.losses[i]);
    worst = std::max(worst, err);
    EXPECT_LE(err, kZooTolerance) << what << ": step " << i << " loss " << got.losses[i]
                                  << ", the whole model's " << want.losses[i];
  }
  EXPECT_EQ(got.state.size(), want.state.size()) << what << ": merged state";
  for (const auto& [name, tensor] : want.state) {
    const auto it = got.state.find(name);
    if (it == got.state.end()) {
      ADD_FAILURE() << what << ": the merged model has no " << name;
      continue;
    }
    if (!tensor.is_floating_point()) {
      EXPECT_TRUE(it->second.equal(tensor)) << what << ": " << name;
      continue;
    }
    const double err = relativeError(it->second, tensor);
    worst = std::max(worst, err);
    EXPECT_LE(err, kZooTolerance) << what << ": " << name << " differs from the whole model's";
  }
  return worst;
}

// Every allowed 2-stage cut (12 drawn when there are more) and 3 three-stage plans, drawn with
// std::mt19937 (the same sequence on every standard library) by hand-written index picks.
std::vector<std::vector<int>> plansToTrain(const std::vector<int>& allowed) {
  std::mt19937 draw(17);
  std::vector<int> single = allowed;
  if (single.size() > 12) {
    for (size_t i = single.size() - 1; i > 0; --i) std::swap(single[i], single[draw() % (i + 1)]);
    single.resize(12);
    std::sort(single.begin(), single.end());
  }
  std::vector<std::vector<int>> plans;
  for (int c : single) plans.push_back({c});
  std::set<std::vector<int>> pairs;
  for (int tries = 0; allowed.size() >= 2 && pairs.size() < 3 && tries < 100; ++tries) {
    size_t a = draw() % allowed.size(), b = draw() % allowed.size();
    if (a == b) continue;
    pairs.insert({allowed[std::min(a, b)], allowed[std::max(a, b)]});
  }
  plans.insert(plans.end(), pairs.begin(), pairs.end());
  return plans;
}

class Zoo : public ::testing::TestWithParam<const char*> {};

TEST_P(Zoo, EveryAllowedCutTrainsAsTheWholeModel) {
  setLogLevel(LogLevel::kWarn);
  const ZooModel m = zooModel(GetParam());
  ClusterizeOptions options;
  options.model_path = m.folder + "/model.pt";
  options.job_path = m.folder + "/job.json";
  options.clusters = 1;
  options.input_shapes = m.shapes;
  options.input_dtypes = m.dtypes;
  const PreparedModel prepared = prepareModel(options);
  const ModelGraph& graph = *prepared.graph;

  // The cuts clusterize allows are exactly the atoms' boundaries.
  const std::vector<int> atoms = graph.atomCuts();
  const std::vector<int> allowed(atoms.begin() + 1, atoms.end() - 1);
  for (int c = 1; c < graph.numUnits(); ++c)
    EXPECT_EQ(graph.isValidCut(c), std::count(allowed.begin(), allowed.end(), c) == 1) << c;
  ASSERT_FALSE(allowed.empty()) << m.name << ": no cut allowed";

  std::map<Batches, Trained> references;
  double worst = 0;
  int trained = 0;
  for (const auto& cuts : plansToTrain(allowed)) {
    const std::string what = m.name + " " + zooCutsText(cuts);
    const std::string work = testing::temporaryDirectory("zoo_" + m.name);
    Trained got;
    try {
      got = trainCut(prepared, m, cuts, work);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " does not train: " << e.what();
      continue;
    }
    if (!references.count(got.batches)) references[got.batches] = trainWhole(m, got.batches);
    worst = std::max(worst, expectTrainedAlike(got, references.at(got.batches), what));
    std::filesystem::remove_all(work);
    ++trained;
  }
  std::printf(
      "zoo %s: %d units, %zu cuts allowed, %d plans trained (%zu of 2 stages, the rest "
      "of 3), worst relative difference to the whole model %.3g\n",
      m.name.c_str(), graph.numUnits(), allowed.size(), trained,
      std::min<size_t>(allowed.size(), 12), worst);
}

INSTANTIATE_TEST_SUITE_P(Models, Zoo,
                         ::testing::Values("cnn", "resnet", "gpt", "gpt_tied", "gpt_rotary",
                                           "gpt_late_pos", "paramless", "two_input"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace cairn::clusterize
