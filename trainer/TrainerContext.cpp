#include "trainer/TrainerContext.h"

#include "trainer/Device.h"

#include "trainer/ClusterSync.h"
#include "trainer/Optimizer.h"
#include "trainer/SharedParameters.h"
#include "trainer/TestFlipBit.h"
#include "trainer/StageExecutor.h"

namespace cairn {

StagePacket TimedLink::crossingForm(const StagePacket& packet) const {
  StagePacket out = packet;
  for (auto& [name, tensor] : out.tensors) {
    const std::optional<torch::Tensor> wire = wireForm(wireFloat(wire_), out.kind, name, tensor);
    if (wire) tensor = *wire;
  }
  return out;
}

void TimedLink::send(Neighbour to, const StagePacket& packet) {
  flush();
  const auto t = TrainerClock::now();
  if (placement_.device().is_cpu()) {
    link_.send(to, packet);  // the link compresses on the host, where the tensors are
  } else {
    StagePacket host = crossingForm(packet);
    for (auto& named : host.tensors) named.second = placement_.toHost(named.second);
    link_.send(to, host);
  }
  times_.send_s += secondsSince(t);
}

void TimedLink::sendLater(Neighbour to, const StagePacket& packet) {
  if (!placement_.copiesLater()) return send(to, packet);
  flush();
  const auto t = TrainerClock::now();
  // On the host (a test double) the link compresses, as in send.
  Later later{to, placement_.device().is_cpu() ? packet : crossingForm(packet), {}, {}};
  for (auto& named : later.host.tensors) {
    later.sources.push_back(named.second);
    later.copies.push_back(placement_.toHostLater(named.second));
    named.second = later.copies.back().host;
  }
  later_ = std::move(later);
  ++times_.later_sends;
  times_.send_s += secondsSince(t);
}

void TimedLink::flush() {
  if (!later_) return;
  const auto t = TrainerClock::now();
  Later later = std::move(*later_);
  later_.reset();
  for (const HostCopy& copy : later.copies) copy.wait();
  link_.send(later.to, later.host);
  times_.send_s += secondsSince(t);
}

StagePacket TimedLink::receive(Neighbour from, PacketKind kind, uint64_t step, uint64_t microbatch,
                               const std::string& tag) {
  if (later_) {  // what is held back waits on only if the awaited packet is here already
    const auto t = TrainerClock::now();
    std::optional<StagePacket> here = link_.tryReceive(from, kind, step, microbatch, tag);
    times_.wait_s += secondsSince(t);
    if (here) {
      ++times_.held_through_receives;
      return std::move(*here);
    }
  }
  flush();
  const auto t = TrainerClock::now();
  StagePacket p = link_.receive(from, kind, step, microbatch, tag);
  times_.wait_s += secondsSince(t);
  return p;
}

void syncBeforeBackward(TrainerContext& ctx, int64_t sync_step, bool last) {
  if (ctx.cfg.cluster_sync)
    ctx.cfg.cluster_sync->beforeBackward(sync_step, ctx.executor.module(), last);
}

void syncBeforeOptimizerStep(TrainerContext& ctx, int64_t sync_step) {
  if (!ctx.cfg.cluster_sync) return;
  const auto t = TrainerClock::now();
  ctx.cfg.cluster_sync->beforeOptimizerStep(sync_step, ctx.executor.module());
  ctx.times.sync_s += secondsSince(t);
}

void optimizerStep(TrainerContext& ctx, double lr, int64_t sync_step, bool new_version) {
  const auto t = TrainerClock::now();
  if (new_version) ctx.executor.newVersion();  // forwards in flight keep the weights they used
  ctx.optimizer.step(lr);
  ctx.optimizer.zeroGrad();
  ctx.times.compute_s += secondsSince(t);
  testFlipBit(ctx.executor.module(), ctx.cfg.node.cluster, ctx.cfg.node.stage, sync_step + 1);
  if (ctx.cfg.cluster_sync) {
    const auto ts = TrainerClock::now();
    ctx.cfg.cluster_sync->afterOptimizerStep(sync_step, ctx.executor.module());
    if (ctx.shared) ctx.shared->shareWeights(sync_step + 1, "shared_weights", /*always=*/false);
    ctx.times.sync_s += secondsSince(ts);
  }
}

}  // namespace cairn
