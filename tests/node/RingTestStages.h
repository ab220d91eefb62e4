// Stage modules for the ring tests (ClusterSync*Test, RingWelcomeTest): a stage built from a named
// state, its state read back, and a seeded stand-in for local training.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <string>

namespace cairn::testing {

using State = std::map<std::string, torch::Tensor>;

// A stage module whose state is `state` (dotted names "<layer>.<name>"), as clusterize's stages
// name theirs. Integer tensors become buffers, floating ones parameters unless named running_*.
inline torch::jit::Module makeStage(const State& state) {
  torch::jit::Module stage("Stage");
  std::map<std::string, torch::jit::Module> layers;
  for (const auto& [name, t] : state) {
    const auto dot = name.find('.');
    const std::string layer = name.substr(0, dot), leaf = name.substr(dot + 1);
    auto it = layers.find(layer);
    if (it == layers.end()) it = layers.emplace(layer, torch::jit::Module("Layer" + layer)).first;
    const bool buffer = !t.is_floating_point() || leaf.rfind("running_", 0) == 0;
    if (buffer)
      it->second.register_buffer(leaf, t.clone());
    else
      it->second.register_parameter(leaf, t.clone().requires_grad_(true), false);
  }
  for (auto& [name, m] : layers) stage.register_module(name, m);
  return stage;
}

inline State stateOf(const torch::jit::Module& stage) {
  State s;
  for (const auto& p : stage.named_parameters(true)) s[p.name] = p.value.detach().clone();
  for (const auto& b : stage.named_buffers(true)) s[b.name] = b.value.detach().clone();
  return s;
}

// Local training stand-in with its own generator (threads must not share torch's global one when
// runs are compared with each other).
inline void perturbSeeded(torch::jit::Module& stage, uint64_t seed) {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (const auto& p : stage.named_parameters(true))
    p.value.add_(at::randn(p.value.sizes(), gen, p.value.options()));
  for (const auto& b : stage.named_buffers(true)) {
    if (b.value.is_floating_point())
      b.value.add_(at::randn(b.value.sizes(), gen, b.value.options()));
    else
      b.value.add_(int64_t(seed % 7));
  }
}

}  // namespace cairn::testing
