// GradNormReducer: gradient clipping by the GLOBAL norm of all stages together
// (training_definition.clip_grad_norm, sync schedule only). Each stage's partial sum of squares
// goes Leaf -> Root ("norm_partial" control packets), the total comes back Root -> Leaf
// ("norm_total"), both as "__norm"; then every stage scales its gradients as clip_grad_norm_ does.
// Ownership: borrows the context and the link. Thread-safety: one thread (the node's trainer
// thread).
#pragma once

#include <cstdint>

#include "trainer/TrainerContext.h"

namespace cairn {

class GradNormReducer {
 public:
  GradNormReducer(TrainerContext& ctx, TimedLink& link) : ctx_(ctx), link_(link) {}
  // Reduces the norm of step `step`'s gradients across the stages, clips them, returns the norm.
  double reduceAndClip(int64_t step);

 private:
  TrainerContext& ctx_;
  TimedLink& link_;
};

}  // namespace cairn
