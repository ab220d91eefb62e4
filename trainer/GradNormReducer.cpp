#include "trainer/GradNormReducer.h"

#include <cmath>

#include "trainer/Optimizer.h"
#include "trainer/ReservedTensors.h"
#include "trainer/SharedParameters.h"

namespace cairn {

double GradNormReducer::reduceAndClip(int64_t step) {
  auto t = TrainerClock::now();
  // A shared parameter counts once: its copies other than the first holder's are left out.
  double partial = squaredGradientNorm(ctx_.shared->withoutCopies(ctx_.optimizer.parameters()));
  ctx_.times.compute_s += secondsSince(t);
  auto control = [&](const char* tag, double value) {
    StagePacket p;
    p.kind = PacketKind::kControl;
    p.step = uint64_t(step);
    p.tag = tag;
    p.tensors.emplace_back(kNormTensor, scalar64(value));
    return p;
  };
  if (!ctx_.is_leaf)
    partial += link_
                   .receive(Neighbour::kDownstream, PacketKind::kControl, uint64_t(step), 0,
                            "norm_partial")
                   .tensor(kNormTensor)
                   .item<double>();
  double total = partial;
  if (!ctx_.is_root) {
    link_.send(Neighbour::kUpstream, control("norm_partial", partial));
    total =
        link_.receive(Neighbour::kUpstream, PacketKind::kControl, uint64_t(step), 0, "norm_total")
            .tensor(kNormTensor)
            .item<double>();
  }
  if (!ctx_.is_leaf) link_.send(Neighbour::kDownstream, control("norm_total", total));
  const double norm = std::sqrt(total);
  t = TrainerClock::now();
  scaleGradientsForClipping(ctx_.optimizer.parameters(), norm, ctx_.opt.clip_grad_norm);
  ctx_.times.compute_s += secondsSince(t);
  return norm;
}

}  // namespace cairn
