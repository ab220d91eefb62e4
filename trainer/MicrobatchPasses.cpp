#include "trainer/MicrobatchPasses.h"

#include "core/Error.h"
#include "trainer/Device.h"
#include "trainer/Loss.h"
#include "trainer/ReservedTensors.h"
#include "trainer/RunPlan.h"
#include "trainer/Sampler.h"
#include "trainer/StageExecutor.h"

namespace cairn {

namespace {

// Gated ring admissions (trainer/ClusterSync.h gateAdmissions): the admission the Root decided
// rides on every activation until its step, as "__admit" int64 [steps_done, growth (0/1),
// cluster, …]; every stage downstream takes it (admitClustersAt is idempotent).
void attachAdmission(const ClusterSync& sync, int64_t step, StagePacket& out) {
  const auto pending = sync.pendingAdmission();
  if (!pending || pending->steps_done <= step) return;
  std::vector<int64_t> values{pending->steps_done, pending->growth ? 1 : 0};
  values.insert(values.end(), pending->clusters.begin(), pending->clusters.end());
  out.tensors.emplace_back(kAdmitTensor, torch::tensor(values, torch::kLong));
}

void readAdmission(ClusterSync& sync, const StagePacket& in) {
  if (!in.has(kAdmitTensor)) return;
  const torch::Tensor& t = in.tensor(kAdmitTensor);
  bool ok = t.scalar_type() == torch::kLong && t.dim() == 1 && t.numel() >= 2;
  ClusterAdmission admission;
  if (ok) {
    const torch::Tensor c = t.contiguous();
    const int64_t* v = c.data_ptr<int64_t>();
    admission.steps_done = v[0];
    admission.growth = v[1] == 1;
    ok = admission.steps_done > int64_t(in.step) && (v[1] == 0 || v[1] == 1) &&
         (admission.growth || c.numel() > 2);
    for (int64_t i = 2; ok && i < c.numel(); ++i) {
      ok = v[i] >= 0 && v[i] < (int64_t(1) << 16);
      admission.clusters.push_back(v[i]);
    }
  }
  if (!ok)
    CAIRN_THROW(BadInput, "activation from upstream for step ", in.step, " micro-batch ",
                in.microbatch, ": ", kAdmitTensor,
                " must be a 1-d int64 tensor [steps_done > the step, growth 0 or 1, cluster in "
                "[0, 65536), …] naming a growth or some cluster");
  sync.admitClustersAt(admission);
}

}  // namespace

void MicrobatchPasses::forward(Microbatch& mb, uint64_t id, int64_t step, int64_t microbatch,
                               uint64_t* id_checksum) {
  const StageTrainerConfig& cfg = ctx_.cfg;
  std::vector<torch::Tensor> inputs;
  if (ctx_.is_root) {
    inputs = mb.inputs;
  } else {
    StagePacket in = link_.receive(Neighbour::kUpstream, PacketKind::kActivation, uint64_t(step),
                                   uint64_t(microbatch), "");
    const size_t n = cfg.node.inputs.size();
    if (in.tensors.size() < n)
      CAIRN_THROW(BadInput, "activation for step ", step, " micro-batch ", microbatch, " has ",
                  in.tensors.size(), " tensors, fewer than the stage's ", n, " inputs");
    for (size_t i = 0; i < n; ++i) inputs.push_back(in.tensors[i].second);
    mb.targets = in.tensor(kTargetsTensor);
    mb.ids = in.tensor(kIdsTensor);
    mb.denominator = in.tensor(kDenominatorTensor);
    if (deal_) deal_->read(in);  // before __stop_at, which is clamped to the (new) total
    if (ctx_.cfg.cluster_sync) readAdmission(*ctx_.cfg.cluster_sync, in);
    stop_.readStopAt(in, ctx_.plan.total_steps);
  }
  const auto t = TrainerClock::now();
  // The Leaf's targets cross to its device with the inputs, before the forward: on a GPU the
  // placement's copy is queued without waiting, where the loss's own copy from the host, after
  // the forward, would wait for the whole forward to finish (trainer/Device.h).
  if (ctx_.is_leaf) mb.targets = ctx_.placement.toDevice(mb.targets);
  std::vector<torch::Tensor> outputs = ctx_.executor.forward(id, inputs);
  if (ctx_.is_leaf) {
    if (mb.targets.size(0) != mb.ids.size(0))
      CAIRN_THROW(BadInput, "micro-batch ", microbatch, " of step ", step, ": ", mb.targets.size(0),
                  " targets for ", mb.ids.size(0), " sample ids");
    mb.loss =
        microbatchLoss(ctx_.opt.loss, outputs.at(0), mb.targets, mb.denominator.item<double>());
    ctx_.times.compute_s += secondsSince(t);
    link_.flush();  // the last backward's gradients leave once this forward is queued
    if (!ctx_.is_root) {
      torch::Tensor ids = mb.ids.to(torch::kLong).contiguous();
      *id_checksum += sampleIdChecksum(ids.data_ptr<int64_t>(), size_t(ids.numel()));
    }
    return;
  }
  ctx_.times.compute_s += secondsSince(t);
  StagePacket out;
  out.kind = PacketKind::kActivation;
  out.step = uint64_t(step);
  out.microbatch = uint64_t(microbatch);
  for (size_t i = 0; i < outputs.size(); ++i)
    out.tensors.emplace_back(cfg.node.outputs[i].name, outputs[i].detach());
  out.tensors.emplace_back(kTargetsTensor, mb.targets);
  out.tensors.emplace_back(kIdsTensor, mb.ids);
  out.tensors.emplace_back(kDenominatorTensor, mb.denominator);
  stop_.attachStopAt(out);
  if (deal_) deal_->attach(out);
  if (ctx_.cfg.cluster_sync) attachAdmission(*ctx_.cfg.cluster_sync, step, out);
  mb.inputs.clear();  // not needed after the forward (the executor keeps what backward needs)
  // This forward is queued: sendLater sends what the last pass left first (on a GPU while this
  // forward runs), and these activations once the next pass is queued or at a wait for a peer.
  link_.sendLater(Neighbour::kDownstream, out);
}

double MicrobatchPasses::backward(Microbatch& mb, uint64_t id, uint64_t step, uint64_t microbatch) {
  double loss_share = 0;
  std::vector<torch::Tensor> input_grads = backwardOf(mb, id, step, microbatch, &loss_share);
  if (!ctx_.is_root) sendInputGradients(step, microbatch, input_grads, loss_share);
  return loss_share;
}

std::vector<torch::Tensor> MicrobatchPasses::backwardOf(Microbatch& mb, uint64_t id, uint64_t step,
                                                        uint64_t microbatch, double* loss_share) {
  if (ctx_.is_leaf) {
    auto t = TrainerClock::now();
    auto input_grads = ctx_.executor.backwardFromLoss(id, mb.loss);
    ctx_.times.compute_s += secondsSince(t);
    link_.flush();  // what the last pass left leaves once this backward is queued
    t = TrainerClock::now();
    if (ctx_.is_root) {  // nobody upstream to tell: read with the step's others (takeLosses)
      unread_losses_[int64_t(step)].push_back(mb.loss.detach().reshape({}));
      *loss_share = 0;
    } else {
      // Read after the backward is under way: on a GPU the read waits for the device, and read
      // before, it would hold back the launch of every backward kernel until the forward is done.
      *loss_share = mb.loss.item<double>();
    }
    ctx_.times.compute_s += secondsSince(t);
    return input_grads;
  }
  StagePacket in =
      link_.receive(Neighbour::kDownstream, PacketKind::kGradient, step, microbatch, "");
  const auto& outputs = ctx_.executor.outputsOf(id);
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    torch::Tensor g = i < in.tensors.size() ? in.tensors[i].second : torch::Tensor();
    if (g.defined() && g.numel() == 0 && outputs[i].numel() != 0) g = torch::Tensor();
    grads.push_back(g);
  }
  *loss_share = in.tensor(kLossTensor).item<double>();
  stop_.readStop(in);
  const auto t = TrainerClock::now();
  auto input_grads = ctx_.executor.backward(id, grads);
  ctx_.times.compute_s += secondsSince(t);
  link_.flush();  // what the last pass left leaves once this backward is queued
  return input_grads;
}

double MicrobatchPasses::takeLosses(int64_t step) {
  const auto it = unread_losses_.find(step);
  if (it == unread_losses_.end()) return 0;
  const auto t = TrainerClock::now();
  const std::vector<double> shares = readScalars(it->second, &ctx_.placement);
  unread_losses_.erase(it);
  double sum = 0;  // float -> double is exact: the sum of what item<double>() read, in order
  for (const double share : shares) sum += share;
  ctx_.times.compute_s += secondsSince(t);  // the wait is for the step's compute
  return sum;
}

void MicrobatchPasses::sendInputGradients(uint64_t step, uint64_t microbatch,
                                          const std::vector<torch::Tensor>& input_grads,
                                          double loss_share) {
  StagePacket out;
  out.kind = PacketKind::kGradient;
  out.step = step;
  out.microbatch = microbatch;
  for (size_t i = 0; i < input_grads.size(); ++i)
    out.tensors.emplace_back(ctx_.cfg.node.inputs[i].name,
                             input_grads[i].defined() ? input_grads[i] : torch::empty({0}));
  out.tensors.emplace_back(kLossTensor, scalar64(loss_share));
  stop_.attachStop(out);
  link_.sendLater(Neighbour::kUpstream, out);  // leaves once the next pass is queued
}

}  // namespace cairn
