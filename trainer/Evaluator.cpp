#include "trainer/Evaluator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/Device.h"
#include "trainer/Loss.h"
#include "trainer/Metrics.h"
#include "trainer/ReservedTensors.h"
#include "trainer/RunPlan.h"
#include "trainer/StageExecutor.h"

namespace cairn {

namespace {

void logEvaluation(const EvalResult& result) {
  std::string line = "evaluation after step " + std::to_string(result.step) + ": " +
                     std::to_string(result.samples) + " test samples, loss " +
                     std::to_string(result.loss);
  if (result.accuracy >= 0) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, ", accuracy %.2f%%", 100.0 * result.accuracy);
    line += buffer;
  }
  if (result.perplexity >= 0) line += ", perplexity " + std::to_string(result.perplexity);
  CAIRN_INFO(line);
}

}  // namespace

EvalResult Evaluator::evaluate(int64_t step) {
  EvalTally tally;
  int64_t samples = 0;
  for (int64_t b = 0; b < ctx_.plan.eval_batches; ++b) passBatch(step, b, &tally, &samples);
  EvalResult result;
  result.step = step;
  if (ctx_.is_leaf) {
    result.samples = samples;
    result.loss = tally.terms ? tally.loss_sum / double(tally.terms) : 0;
    if (lossReportsAccuracy(ctx_.opt.loss))
      result.accuracy = tally.terms ? double(tally.correct) / double(tally.terms) : 0;
    if (ctx_.cfg.data.format == "tokens") result.perplexity = std::exp(result.loss);
  }
  const nlohmann::json j = shareResult(step, &result);
  ctx_.metrics.write({{"eval", j}});
  logEvaluation(result);
  return result;
}

std::vector<torch::Tensor> Evaluator::forwardBatch(int64_t step, int64_t b,
                                                   torch::Tensor* targets) {
  if (ctx_.is_root) {
    const int64_t n = data_.test->size();
    std::vector<int64_t> ids;
    for (int64_t i = b * ctx_.opt.eval_batch_size;
         i < std::min(n, (b + 1) * ctx_.opt.eval_batch_size); ++i)
      ids.push_back(i);
    Batch batch = data_.test->get(ids, /*training=*/false);
    *targets = batch.targets;
    return ctx_.executor.evaluate(batch.modelInputs());
  }
  StagePacket in = link_.receive(Neighbour::kUpstream, PacketKind::kEvaluation, uint64_t(step),
                                 uint64_t(b), "");
  std::vector<torch::Tensor> inputs;
  for (size_t i = 0; i < ctx_.cfg.node.inputs.size() && i < in.tensors.size(); ++i)
    inputs.push_back(in.tensors[i].second);
  *targets = in.tensor(kTargetsTensor);
  return ctx_.executor.evaluate(inputs);
}

void Evaluator::passBatch(int64_t step, int64_t b, EvalTally* tally, int64_t* samples) {
  torch::Tensor targets;
  const std::vector<torch::Tensor> outputs = forwardBatch(step, b, &targets);
  if (ctx_.is_leaf) {
    // The targets cross like the training ones (MicrobatchPasses): pinned and queued, not copied
    // from pageable memory inside the tally, which would wait for the forward on a GPU.
    EvalTally t = evaluationTally(ctx_.opt.loss, outputs.at(0), ctx_.placement.toDevice(targets));
    tally->loss_sum += t.loss_sum;
    tally->terms += t.terms;
    tally->correct += t.correct;
    *samples += targets.size(0);
  } else {
    StagePacket out;
    out.kind = PacketKind::kEvaluation;
    out.step = uint64_t(step);
    out.microbatch = uint64_t(b);
    for (size_t i = 0; i < outputs.size(); ++i)
      out.tensors.emplace_back(ctx_.cfg.node.outputs[i].name, outputs[i]);
    out.tensors.emplace_back(kTargetsTensor, targets);
    link_.send(Neighbour::kDownstream, out);
  }
}

nlohmann::json Evaluator::shareResult(int64_t step, EvalResult* result) {
  nlohmann::json j;
  if (!ctx_.is_leaf) {
    StagePacket in = link_.receive(Neighbour::kDownstream, PacketKind::kControl, uint64_t(step), 0,
                                   "eval_result");
    j = nlohmann::json::parse(in.text, nullptr, false);
    if (j.is_discarded()) CAIRN_THROW(BadInput, "malformed evaluation result from downstream");
    result->samples = j.value("samples", int64_t(0));
    result->loss = j.value("loss", 0.0);
    result->accuracy = j.value("accuracy", -1.0);
    result->perplexity = j.value("perplexity", -1.0);
  } else {
    j = {{"step", result->step},
         {"samples", result->samples},
         {"loss", result->loss},
         {"accuracy", result->accuracy},
         {"perplexity", result->perplexity}};
  }
  if (!ctx_.is_root) {
    StagePacket out;
    out.kind = PacketKind::kControl;
    out.step = uint64_t(step);
    out.tag = "eval_result";
    out.text = j.dump();
    link_.send(Neighbour::kUpstream, out);
  }
  return j;
}

}  // namespace cairn
