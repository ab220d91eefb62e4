// NodeRunner: one node's run with failure handling (docs/OPERATIONS.md "Failures while training").
// It owns the sequence the provider used to write inline — hello handshake, StageTrainer, result —
// and adds pause and resume:
//   * a pipeline neighbour lost mid-run (MailboxStageLink::lost(): connection down for
//     peer_timeout_s, "leaving", or a restart) with checkpoints on: tell the other neighbour
//     ("leaving", reason "paused", naming the lost node) so the pause spreads along the pipeline,
//     leave the rings (ClusterSync), wait up to max_wait_s for a fresh hello handshake (the lost
//     node back with --resume), agree with the whole cluster on the resume step
//     (agreeOnResumeStep), and train on from there with a fresh StageTrainer (fresh stage.pt,
//     resume_step, joining the rings). Without the node after max_wait_s: PeerLost naming it and
//     the command that resumes it. Without checkpoints: PeerLost as before, with a hint.
//   * --resume: the same agreement right after the first handshake.
//   * a stop request (signal): the trainer stops the cluster at a step boundary and checkpoints;
//     the runner tells the neighbours ("leaving", reason "stopped") and leaves the rings.
//   * a hand-over (StageTrainerConfig::stop_hands_over, provider --join): the cluster stops the
//     same way, but only the node that asked leaves ("leaving", reason kHandOverReason); every
//     other node pauses as for a lost neighbour, waits up to max_wait_s for the replacement's
//     handshake, and resumes with it from the agreed step (the stop's checkpoint when the
//     replacement was given it).
//   * a neighbour that restarts while this node agrees on the resume step (its "hello"): a fresh
//     handshake and the agreement again (up to kMaxAgreementRestarts times).
// Ownership: borrows the mailbox, link and cluster sync (all must outlive it); owns the trainer of
// the current attempt. Thread-safety: the transport's owning thread only.
#pragma once

#include <torch/script.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "node/pipeline/MailboxStageLink.h"
#include "trainer/StageTrainer.h"

namespace cairn {

class RingClusterSync;

// The "leaving" reason of a node that hands its stage over (not "stopped": its neighbours pause
// for its replacement instead of stopping).
inline constexpr const char* kHandOverReason = "handing over";
// How often one resume agreement starts afresh because a neighbour restarted.
inline constexpr int kMaxAgreementRestarts = 8;

// Thrown by agreeOnResumeStep when the neighbour it waits on says "hello" (it restarted).
struct NeighbourRestarted : Error {
  explicit NeighbourRestarted(std::string m, const char* f = "", int l = 0)
      : Error(ErrorKind::kPeerLost, std::move(m), f, l) {}
};

struct NodeRunnerConfig {
  StageTrainerConfig trainer;  // checkpoint_dir set when checkpoints are on
  std::string stage_path;      // stage.pt, loaded afresh for every attempt
  std::string node_data;       // for the resume hint
  bool resume = false;         // provider --resume
  std::chrono::milliseconds max_wait{600000};
  // Valid checkpoint steps in a folder, ascending (default: validCheckpointSteps).
  std::function<std::vector<int64_t>(const std::string&)> checkpoint_steps;
  // Given to every attempt's trainer (provider --join streams its records with it).
  TrainerObserver observer;
  // "paused" (a neighbour lost) and "resumed" (the cluster agreed on the step), with a message.
  std::function<void(const std::string& state, const std::string& message)> on_state;
  // The deal in force now (node.json's extra.deal as on disk: the Root writes a deal it takes
  // there; null when none). A resumed attempt plans with it, not with the one the run began with:
  // a Root that took a deal and paused before its next checkpoint otherwise retrained those
  // steps under the old deal (the 24-volunteer soak: step 124 trained on two clusters' samples).
  std::function<nlohmann::json()> deal_in_force;
};

struct NodeRunResult {
  TrainerResult result;
  int pauses = 0;           // times this node paused and resumed
  int64_t resumed_from = -1;  // the last agreed resume step (-1: started from scratch)
};

// The TorchScript stage at `path`; BadInput naming the file when it cannot be loaded.
torch::jit::Module loadStage(const std::string& path);

class NodeRunner {
 public:
  NodeRunner(NodeRunnerConfig config, Mailbox& mailbox, MailboxStageLink& link,
             RingClusterSync* cluster_sync);
  ~NodeRunner();
  NodeRunResult run();
  // The trainer of the last attempt (for its weights after run()).
  StageTrainer& trainer();

  // The resume agreement over the pipeline (control messages "ckpt_steps" Leaf → Root, each node
  // intersecting with its own valid steps; "resume_at" Root → Leaf): every node of the cluster
  // calls it after a handshake; it returns the newest step all hold (-1: none) and purges the
  // abandoned run's pipeline messages. BadInput naming the peer for a malformed message; PeerLost
  // when a neighbour does not answer within `timeout`; NeighbourRestarted when the neighbour it
  // waits on says "hello" instead (the hello stays in the mailbox); Interrupted when
  // `interrupted` (may be empty) says yes while it waits.
  static int64_t agreeOnResumeStep(Mailbox& mailbox, MailboxStageLink& link,
                                   std::vector<int64_t> own_steps, std::chrono::milliseconds timeout,
                                   const std::function<bool()>& interrupted = {});

 private:
  // The resume agreement of an attempt that resumes (--resume, or after a pause): logged, told
  // to on_state after a pause, the rings joined afresh; returns the agreed step (-1: from scratch),
  // nullopt when stopped by a signal meanwhile (out.result.stopped).
  std::optional<int64_t> agreeOnResume(NodeRunResult& out);
  // The observer given to an attempt's trainer; a resumed attempt also logs its first step.
  TrainerObserver attemptObserver(bool resuming) const;
  // trainer_->run() gave up a wait because a stop was asked (Interrupted): this node leaves as at
  // a clean stop, without a checkpoint of the unfinished step.
  void leaveMidStep(const Interrupted& e, NodeRunResult& out);
  // A neighbour stopped on a signal: this node tells the other neighbour and stops too.
  void stopWithNeighbour(const PeerLoss& lost, NodeRunResult& out);
  // A neighbour lost (`e`, `lost`): pause the cluster and wait up to max_wait for a fresh
  // handshake. True: resume; false: stopped by a signal while paused. Throws PeerLost without
  // checkpoints or when the lost node does not come back.
  bool pauseUntilBack(const PeerLost& e, const PeerLoss& lost, NodeRunResult& out);
  // The cluster stopped for another node's hand-over: pause as for a lost neighbour. True: resume;
  // false: stopped by a signal while paused.
  bool pauseForHandOver(NodeRunResult& out);
  // Both pauses: tell on_state ("paused", `paused_message`), leave the rings, drop the trainer
  // and wait up to max_wait for a fresh handshake. True: resume (counted in out.pauses); false:
  // stopped by a signal meanwhile (out.result.stopped). A neighbour that does not come back:
  // PeerLost with gave_up(its reason).
  bool waitForHandshake(NodeRunResult& out, const std::string& paused_message,
                        const std::function<std::string(const std::string&)>& gave_up);

  NodeRunnerConfig config_;
  Mailbox& mailbox_;
  MailboxStageLink& link_;
  RingClusterSync* cluster_sync_;
  std::unique_ptr<StageTrainer> trainer_;
};

}  // namespace cairn
