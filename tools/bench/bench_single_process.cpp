// bench_single_process: the baseline for bench_pipeline — one process, one libtorch training loop
// over the UNSPLIT TorchScript model, same data, batch size, optimizer and intra-op thread count as
// the pipeline run it is compared with. Prints "single_process_samples_per_s <n>".
// --job JOB.json takes data, batch size, optimizer, lr and loss from a job.json (the one the pipeline
// ran with; schedule/pipeline/sync keys are ignored: one process has no pipeline), so any example
// (Fashion-MNIST idx, tiny GPT tokens) is compared on exactly its own training definition.
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <chrono>

#include "core/BlasThreads.h"
#include "core/MainGuard.h"
#include "trainer/Dataset.h"
#include "trainer/Loss.h"
#include "trainer/Optimizer.h"
#include "trainer/Sampler.h"
#include "trainer/TrainOptions.h"

#include "tools/bench/BenchMains.h"

// Inside cairn_bench (tools/bench/bench_main.cpp), run as build/tools/bench/bench_single_process.
namespace cairn::bench::single_process {

int run(int argc, char** argv) {
  CLI::App app{"bench_single_process: train the unsplit model in one process and report samples/s"};
  std::string model_path, job_path, data = "/usr/share/datasets/fashion-mnist";
  int64_t steps = 200, batch_size = 128, warmup = 10;
  int threads = 1;
  double lr = 0.003;
  app.add_option("--model", model_path, "TorchScript model (.pt)")->required();
  app.add_option("--data", data, "IDX folder")->capture_default_str();
  app.add_option("--job", job_path,
                 "job.json: data, batch_size, optimizer and loss_fn from it (overrides --data, "
                 "--batch-size, --lr)");
  app.add_option("--steps", steps, "timed optimizer steps")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--batch-size", batch_size)->capture_default_str();
  app.add_option("--threads", threads, "torch intra-op threads")->capture_default_str();
  app.add_option("--lr", lr)->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("bench_single_process", [&] {
    at::set_num_threads(threads);
    // The reference is the process a PyTorch user would run: its threads serve BLAS too (a
    // provider pins BLAS to one thread for bit-exact runs, core/BlasThreads.h; run_all's
    // OPENBLAS_NUM_THREADS=1 is only the default).
    cairn::setBlasThreads(threads);
    at::set_num_interop_threads(1);
    cairn::DataOptions d;
    d.location = data;
    d.format = "idx";
    d.normalize.mean = {0.2860};
    d.normalize.std = {0.3530};
    cairn::OptimizerOptions o;
    o.lr = lr;
    o.weight_decay = 0.01;
    cairn::LossOptions loss_options;
    if (!job_path.empty()) {
      cairn::JobSpec job = cairn::readJobSpec(job_path);
      for (const char* key : {"schedule", "pipeline", "sync"}) job.training.erase(key);
      const cairn::TrainOptions t = cairn::parseTrainOptions(job.training, job_path);
      d = cairn::parseDataOptions(job.data, job_path);
      d.chunk.clear();
      d.chunks = 1;
      batch_size = t.batch_size;
      o = t.optimizer;
      lr = o.lr;
      loss_options = t.loss;
    }
    cairn::DatasetPair datasets = cairn::loadDatasets(d, 0);
    cairn::ShardSampler sampler(datasets.train->size(), 0, 1, 0, {}, 0);
    std::vector<int64_t> order = sampler.epochOrder(0);
    torch::jit::Module model = torch::jit::load(model_path);
    model.train();
    std::vector<torch::Tensor> params;
    for (const auto& p : model.parameters()) params.push_back(p);
    cairn::Optimizer optimizer(params, o);
    const int64_t per_epoch = int64_t(order.size()) / batch_size;
    auto start = std::chrono::steady_clock::now();
    for (int64_t step = 0; step < warmup + steps; ++step) {
      if (step == warmup) start = std::chrono::steady_clock::now();
      const int64_t position = step % per_epoch;
      std::vector<int64_t> ids(order.begin() + position * batch_size,
                               order.begin() + (position + 1) * batch_size);
      cairn::Batch batch = datasets.train->get(ids, true);
      torch::Tensor out = model.forward({batch.inputs}).toTensor();
      torch::Tensor loss =
          cairn::microbatchLoss(loss_options, out, batch.targets,
                              double(cairn::lossTermCount(loss_options, batch.targets)));
      loss.backward();
      optimizer.step(lr);
      optimizer.zeroGrad();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("single_process_samples_per_s %.1f\n", double(steps * batch_size) / seconds);
    return 0;
  });
}

}  // namespace cairn::bench::single_process
