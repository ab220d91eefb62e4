// bench_precision: one stage's forward + backward (cairn's StageExecutor, the whole model as one
// stage) in fp32 and in bf16 (job.json "precision": "bf16"), alternating iteration by iteration so
// both see the same machine load. Prints the first step's loss in both, the relative L2 error of
// bf16's parameter gradients against fp32's, and min / median milliseconds per iteration:
//   bench_precision --model cnn.pt --input 64,1,28,28 --classes 10
//   bench_precision --model gpt.pt --tokens 16,64 --classes 256
// (models: examples/*/make_model.py). Random inputs and targets, cross-entropy loss.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/MainGuard.h"
#include "trainer/Loss.h"
#include "trainer/Precision.h"
#include "trainer/StageExecutor.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_precision.
namespace cairn::bench::precision {

namespace {

std::vector<int64_t> shapeOf(const std::string& text) {
  std::vector<int64_t> shape;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    shape.push_back(std::stoll(text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return shape;
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"bench_precision: fp32 vs bf16 forward+backward of one TorchScript model"};
  std::string model_path, input, tokens;
  int64_t classes = 10, iterations = 15;
  int threads = 1;
  app.add_option("--model", model_path, "TorchScript model (.pt)")->required();
  app.add_option("--input", input, "float input shape, e.g. 64,1,28,28");
  app.add_option("--tokens", tokens, "token input shape N,T (ids < --classes)");
  app.add_option("--classes", classes, "output classes (last dimension)")->capture_default_str();
  app.add_option("--iterations", iterations, "timed iterations of each")->capture_default_str();
  app.add_option("--threads", threads, "torch intra-op threads")->capture_default_str();
  try {
    app.parse(argc, argv);
    if (input.empty() == tokens.empty()) throw CLI::ValidationError("give --input or --tokens");
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("bench_precision", [&] {
    at::set_num_threads(threads);
    at::set_num_interop_threads(1);
    torch::manual_seed(0);
    torch::Tensor x, y;
    if (!input.empty()) {
      x = torch::randn(shapeOf(input));
      y = torch::randint(0, classes, {x.size(0)}, torch::kLong);
    } else {
      x = torch::randint(0, classes, shapeOf(tokens), torch::kLong);
      y = torch::randint(0, classes, x.sizes(), torch::kLong);
    }
    const std::vector<cairn::BoundaryValue> in = {
        {"x", "tensor", input.empty() ? "int64" : "float32", {}}};
    const std::vector<cairn::BoundaryValue> out = {{"y", "tensor", "float32", {}}};
    cairn::StageExecutor executor(torch::jit::load(model_path), in, out, false);
    const cairn::LossOptions loss_options;
    const double denominator = double(cairn::lossTermCount(loss_options, y));
    uint64_t id = 0;
    // One forward + backward; returns the loss, leaves the gradients in the parameters.
    auto step = [&](cairn::Precision precision) {
      executor.setPrecision(precision);
      for (auto& p : executor.parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
      const torch::Tensor output = executor.forward(id, {x})[0];
      const torch::Tensor loss = cairn::microbatchLoss(loss_options, output, y, denominator);
      executor.backwardFromLoss(id++, loss);
      return loss.item<double>();
    };
    auto gradients = [&] {
      std::vector<torch::Tensor> g;
      for (auto& p : executor.parameters())
        if (p.grad().defined()) g.push_back(p.grad().clone());
      return g;
    };
    const double loss32 = step(cairn::Precision::kFp32);
    const auto g32 = gradients();
    const double loss16 = step(cairn::Precision::kBf16);
    const auto g16 = gradients();
    double error = 0, norm = 0;
    for (size_t i = 0; i < g32.size(); ++i) {
      error += (g16[i] - g32[i]).pow(2).sum().item<double>();
      norm += g32[i].pow(2).sum().item<double>();
    }
    std::vector<double> ms[2];
    for (int64_t i = 0; i < iterations + 3; ++i)
      for (int bf16 = 0; bf16 < 2; ++bf16) {
        const auto t = std::chrono::steady_clock::now();
        step(bf16 ? cairn::Precision::kBf16 : cairn::Precision::kFp32);
        const double elapsed =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
        if (i >= 3) ms[bf16].push_back(elapsed);  // 3 warm-up rounds (the JIT profiles first)
      }
    for (auto& m : ms) std::sort(m.begin(), m.end());
    std::printf("%s: loss fp32 %.6f bf16 %.6f, gradient relative error %.2e; "
                "ms per forward+backward (threads %d, %lld iterations): fp32 min %.1f median %.1f, "
                "bf16 min %.1f median %.1f; median speed-up %.2fx\n",
                model_path.c_str(), loss32, loss16, std::sqrt(error / norm), threads,
                static_cast<long long>(iterations), ms[0][0], ms[0][ms[0].size() / 2], ms[1][0],
                ms[1][ms[1].size() / 2], ms[0][ms[0].size() / 2] / ms[1][ms[1].size() / 2]);
    return 0;
  });
}

}  // namespace cairn::bench::precision
