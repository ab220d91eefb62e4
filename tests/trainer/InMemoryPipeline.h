// Test helper: runs the StageTrainers of one cluster as threads joined by in-memory StageLinks
// (no sockets), so the schedule/executor/loss/optimizer logic is tested exactly as the provider
// runs it, minus the transport.
#pragma once

#include <torch/script.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/Error.h"
#include "core/NodeData.h"
#include "trainer/Optimizer.h"
#include "trainer/StageExecutor.h"
#include "trainer/StageLink.h"
#include "trainer/StageTrainer.h"
#include "trainer/TrainOptions.h"

namespace cairn::testing {

class InMemoryHub {
 public:
  explicit InMemoryHub(int nodes) : inboxes_(size_t(nodes)) {}
  // Called with every packet sent, once it is in the receiver's inbox (from the sender's thread,
  // before its send returns); set before the run.
  std::function<void(int from, const StagePacket&)> on_push;
  // True for a packet the wire loses (it never arrives); set before the run.
  std::function<bool(int from, const StagePacket&)> drop;
  // How long a receive waits before its PeerLost (cause silent, as a stage link's peer timeout).
  std::chrono::milliseconds patience{60000};
  void push(int to, int from, StagePacket packet) {
    if (drop && drop(from, packet)) return;
    const StagePacket seen = on_push ? packet : StagePacket();  // its tensors are shared
    Inbox& box = inboxes_[size_t(to)];
    {
      std::lock_guard<std::mutex> lock(box.mutex);
      box.packets.push_back({from, std::move(packet)});
      box.ready.notify_all();
    }
    if (on_push) on_push(from, seen);
  }
  // Packets sent but never received, over all nodes (0 after a run that ended cleanly).
  size_t undelivered() {
    size_t count = 0;
    for (Inbox& box : inboxes_) {
      std::lock_guard<std::mutex> lock(box.mutex);
      count += box.packets.size();
    }
    return count;
  }
  StagePacket pop(int at, int from, PacketKind kind, uint64_t step, uint64_t mb,
                  const std::string& tag) {
    Inbox& box = inboxes_[size_t(at)];
    std::unique_lock<std::mutex> lock(box.mutex);
    const auto deadline = std::chrono::steady_clock::now() + patience;
    for (;;) {
      if (std::optional<StagePacket> found = take(box, from, kind, step, mb, tag)) return *found;
      if (box.ready.wait_until(lock, deadline) == std::cv_status::timeout)
        CAIRN_THROW_LOST((PeerLoss{"node_" + std::to_string(from), LossCause::kSilent, "",
                                   "node_" + std::to_string(from)}),
                         "in-memory pipeline: node ", at, " waited ", patience.count(),
                         " ms for a ", toString(kind), " from node ", from, " (step ", step,
                         ", micro-batch ", mb, ", tag ", tag, ")");
    }
  }
  // pop without waiting: nullopt when the packet has not arrived.
  std::optional<StagePacket> tryPop(int at, int from, PacketKind kind, uint64_t step, uint64_t mb,
                                    const std::string& tag) {
    Inbox& box = inboxes_[size_t(at)];
    std::lock_guard<std::mutex> lock(box.mutex);
    return take(box, from, kind, step, mb, tag);
  }

 private:
  struct Inbox {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::pair<int, StagePacket>> packets;
  };
  // The packet asked for, out of `box` (its mutex held); nullopt when it is not there.
  static std::optional<StagePacket> take(Inbox& box, int from, PacketKind kind, uint64_t step,
                                         uint64_t mb, const std::string& tag) {
    for (auto it = box.packets.begin(); it != box.packets.end(); ++it) {
      const StagePacket& p = it->second;
      if (it->first == from && p.kind == kind && p.step == step && p.microbatch == mb &&
          p.tag == tag) {
        StagePacket found = std::move(it->second);
        box.packets.erase(it);
        return found;
      }
    }
    return std::nullopt;
  }
  std::vector<Inbox> inboxes_;
};

class InMemoryLink : public StageLink {
 public:
  InMemoryLink(InMemoryHub& hub, int stage) : hub_(hub), stage_(stage) {}
  void send(Neighbour to, const StagePacket& packet) override {
    StagePacket copy = packet;
    for (auto& [name, t] : copy.tensors) t = t.detach().clone();  // what the wire does
    hub_.push(to == Neighbour::kUpstream ? stage_ - 1 : stage_ + 1, stage_, std::move(copy));
  }
  StagePacket receive(Neighbour from, PacketKind kind, uint64_t step, uint64_t mb,
                      const std::string& tag) override {
    return hub_.pop(stage_, from == Neighbour::kUpstream ? stage_ - 1 : stage_ + 1, kind, step, mb,
                    tag);
  }
  std::optional<StagePacket> tryReceive(Neighbour from, PacketKind kind, uint64_t step, uint64_t mb,
                                        const std::string& tag) override {
    return hub_.tryPop(stage_, from == Neighbour::kUpstream ? stage_ - 1 : stage_ + 1, kind, step,
                       mb, tag);
  }

 private:
  InMemoryHub& hub_;
  int stage_;
};

struct PipelineRun {
  std::vector<std::vector<int64_t>> batches;        // sample ids per step (from the Root)
  std::vector<double> losses;                       // per step (from the Leaf)
  std::map<std::string, torch::Tensor> parameters;  // trained, by dotted name, all stages
  std::map<std::string, torch::Tensor> buffers;     // BatchNorm statistics etc., all stages
  // Per node: its optimizer's state as a checkpoint names it ("optim.<i>.<field>").
  std::vector<std::map<std::string, torch::Tensor>> optimizer_state;
  std::vector<TrainerResult> results;
  size_t undelivered = 0;  // packets sent that no node received
};

// Runs every node of `node_data` (one cluster) in threads. `adjust` may change the options,
// `configure` (optional) the whole config of node i (checkpoints, resume, stop); `on_send`
// (optional) sees every packet node `from` sends, once it is in the receiver's inbox; `setup_hub`
// (optional) sets the hub's faults (drop, patience).
inline PipelineRun runInMemoryPipeline(
    const std::string& node_data, const std::function<void(TrainOptions&)>& adjust,
    const std::function<void(int, StageTrainerConfig&)>& configure = {},
    const std::function<void(int from, const StagePacket&)>& on_send = {},
    const std::function<void(InMemoryHub&)>& setup_hub = {}) {
  const JobSpec job = readJobSpec(jobSpecPath(node_data));
  std::vector<NodeSpec> nodes;
  for (int i = 0;; ++i) {
    const std::string path = nodeSpecPath(node_data, "node_" + std::to_string(i));
    if (!std::ifstream(path).good()) break;
    nodes.push_back(readNodeSpec(path));
  }
  const int n = int(nodes.size());
  InMemoryHub hub(n);
  hub.on_push = on_send;
  if (setup_hub) setup_hub(hub);
  PipelineRun run;
  run.results.resize(size_t(n));
  std::vector<std::unique_ptr<InMemoryLink>> links;
  std::vector<std::unique_ptr<StageTrainer>> trainers;
  for (int i = 0; i < n; ++i) {
    StageTrainerConfig config;
    config.node = nodes[size_t(i)];
    config.options = parseTrainOptions(job.training, jobSpecPath(node_data));
    adjust(config.options);
    config.data = parseDataOptions(job.data, jobSpecPath(node_data));
    config.show_progress = false;
    if (configure) configure(i, config);
    TrainerObserver observer;
    if (i == 0)
      observer.on_batch = [&run](int64_t, const std::vector<int64_t>& ids) {
        run.batches.push_back(ids);
      };
    if (i == n - 1)
      observer.on_step_loss = [&run](int64_t, double loss) { run.losses.push_back(loss); };
    links.push_back(std::make_unique<InMemoryLink>(hub, i));
    trainers.push_back(std::make_unique<StageTrainer>(
        config, torch::jit::load(nodeDirectory(node_data, config.node.name) + "/stage.pt"),
        *links.back(), observer));
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        run.results[size_t(i)] = trainers[size_t(i)]->run();
      } catch (...) {
        errors[size_t(i)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  // The cause first: a node that failed makes its neighbours wait in vain (PeerLost).
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const PeerLost&) {
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  run.undelivered = hub.undelivered();
  for (auto& t : trainers)
    for (auto& [name, p] : t->executor().namedParameters())
      run.parameters[name] = p.detach().clone();
  for (auto& t : trainers)
    for (const auto& b : t->executor().module().named_buffers(/*recurse=*/true))
      run.buffers[b.name] = b.value.detach().clone();
  for (auto& t : trainers) {
    std::vector<std::pair<std::string, torch::Tensor>> state;
    t->optimizer().exportState(&state);
    auto& kept = run.optimizer_state.emplace_back();
    for (auto& [name, tensor] : state) kept[name] = tensor.detach().clone();
  }
  return run;
}

}  // namespace cairn::testing
