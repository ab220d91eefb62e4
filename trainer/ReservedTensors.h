// ReservedTensors: the names of the bookkeeping tensors that ride on pipeline packets next to a
// stage's boundary tensors, defined once (docs/TRAINING.md "One step, as data", "Stopping").
// Every name starts with kReservedPrefix, which no boundary tensor may use: receivers tell
// bookkeeping from boundary tensors by that prefix alone.
// Ownership: constants only. Thread-safety: immutable.
#pragma once

#include <string>

namespace cairn {

// The prefix that marks a tensor name as bookkeeping rather than a stage boundary value.
inline constexpr const char* kReservedPrefix = "__";

// Activations (Root -> Leaf): the micro-batch's targets, its sample ids, and the number of loss
// terms in the whole batch (so the Leaf computes each micro-batch's share of the batch loss).
inline constexpr const char* kTargetsTensor = "__targets";
inline constexpr const char* kIdsTensor = "__ids";
inline constexpr const char* kDenominatorTensor = "__denominator";
// Gradients (Leaf -> Root): the micro-batch's share of the step loss.
inline constexpr const char* kLossTensor = "__loss";
// Control packets "norm_partial" / "norm_total": a partial or total squared gradient norm.
inline constexpr const char* kNormTensor = "__norm";
// Clean stop: "__stop" rides upstream on gradient packets once a node (or one downstream of it)
// was asked to stop; "__stop_at" rides downstream on activation packets once the Root has decided
// the step count at which the whole cluster stops.
// Both carry the stop's kind (int64): 1 a stop of the whole cluster, 2 a hand-over (the nodes that
// asked leave; the others wait for their replacement). "__stop_kind" rides next to "__stop_at".
inline constexpr const char* kStopTensor = "__stop";
inline constexpr const char* kStopAtTensor = "__stop_at";
inline constexpr const char* kStopKindTensor = "__stop_kind";
// A deal taken mid-run (trainer/DealChange.h): rides downstream on activation packets once the
// Root changed the run's epoch_steps table: int64 [total_steps, from_epoch, steps, …].
inline constexpr const char* kEpochStepsTensor = "__epoch_steps";
// Gated ring admissions (trainer/ClusterSync.h gateAdmissions): rides downstream on activation
// packets while an admission the Root decided is pending: int64 [steps_done, growth (1: a
// growth's held members too, ClusterSync::admitJoinersAt), cluster, …].
inline constexpr const char* kAdmitTensor = "__admit";

// True for names that start with kReservedPrefix (bookkeeping, not a boundary tensor).
inline bool isReservedTensorName(const std::string& name) {
  return name.rfind(kReservedPrefix, 0) == 0;
}

}  // namespace cairn
