// MicrobatchPasses: one micro-batch's forward and backward through this stage and across its
// neighbours, shared by the sync and async loops. Activations go downstream with the boundary
// tensors plus "__targets", "__ids" and "__denominator" (and "__stop_at" once the Root decided a
// stop, "__epoch_steps" after a deal, "__admit" while a ring admission is pending); gradients come back with "__loss", each micro-batch's share of the batch loss, so every
// node knows the step loss (and "__stop" when a node downstream asked to stop). Reserved names:
// trainer/ReservedTensors.h.
// Ownership: borrows the context, the link and the stop coordinator. Thread-safety: one thread
// (the node's trainer thread).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "trainer/DealChange.h"
#include "trainer/StopCoordinator.h"
#include "trainer/TrainerContext.h"

namespace cairn {

class MicrobatchPasses {
 public:
  MicrobatchPasses(TrainerContext& ctx, TimedLink& link, StopCoordinator& stop)
      : ctx_(ctx), link_(link), stop_(stop) {}
  // A deal taken mid-run (trainer/DealChange.h): its "__epoch_steps" is read from and attached
  // to activations. Optional (null: none).
  void setDealChange(DealChange* deal) { deal_ = deal; }

  // What a pass sends leaves with TimedLink::sendLater: once the next pass's forward or backward
  // is queued (each pass sends what the last one left right after queueing its own work), or
  // at a wait for a peer, whichever comes first; on a GPU the copy of micro-batch k to the host
  // then runs behind the work of the next one instead of holding back its launch. On the CPU
  // everything leaves at once.
  //
  // The Root runs mb.inputs; other stages receive the activation for (step, microbatch) from
  // upstream with its targets, ids and denominator. The Leaf computes the micro-batch's loss share
  // (and, when it is not also the Root, adds its sample ids to *id_checksum); other stages send
  // their outputs on. `id` is the executor's micro-batch key.
  void forward(Microbatch& mb, uint64_t id, int64_t step, int64_t microbatch,
               uint64_t* id_checksum);
  // The Leaf starts from its loss; other stages receive the gradient of their outputs for
  // (step, microbatch) from downstream (an empty tensor means "no gradient"). Then, on every stage
  // but the Root, the input gradients go upstream (an empty tensor for "no gradient") with the
  // micro-batch's share of the step loss, which is returned — except on a stage that is both
  // Root and Leaf (one stage holds the whole model), which sends its loss nowhere: there the
  // share stays on the device, 0 is returned, and takeLosses(step) reads the step's shares.
  double backward(Microbatch& mb, uint64_t id, uint64_t step, uint64_t microbatch);
  // The sum, in micro-batch order, of the loss shares of `step` that backward kept on the device
  // (0 when it kept none), read to the host in one copy through the placement; forgets them.
  // Called once the step's optimizer step is launched: on a GPU the read waits for the device, so
  // a whole-model stage waits once per step, after queueing all of the step's work, instead of
  // once per micro-batch before queueing the next one. The sum is the one backward's returned
  // shares would have made (the same additions in the same order).
  double takeLosses(int64_t step);
  // Sends what the last pass left to send (TimedLink::flush): the loops call it before anything
  // that may wait outside the link (a cross-cluster sync, the step's end).
  void flush() { link_.flush(); }

 private:
  std::vector<torch::Tensor> backwardOf(Microbatch& mb, uint64_t id, uint64_t step,
                                        uint64_t microbatch, double* loss_share);
  void sendInputGradients(uint64_t step, uint64_t microbatch,
                          const std::vector<torch::Tensor>& input_grads, double loss_share);

  TrainerContext& ctx_;
  TimedLink& link_;
  StopCoordinator& stop_;
  DealChange* deal_ = nullptr;
  std::map<int64_t, std::vector<torch::Tensor>> unread_losses_;  // by step (backward's order)
};

}  // namespace cairn
