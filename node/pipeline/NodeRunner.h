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
// Ownership: borrows the mailbox, link and cluster sync (all must outlive it); owns the trainer of
// the current attempt. Thread-safety: the transport's owning thread only.
#pragma once

#include <torch/script.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "node/pipeline/MailboxStageLink.h"
#include "trainer/StageTrainer.h"

namespace cairn {

class RingClusterSync;

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
};

struct NodeRunResult {
  TrainerResult result;
  int pauses = 0;           // times this node paused and resumed
  int64_t resumed_from = -1;  // the last agreed resume step (-1: started from scratch)
};

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
  // when a neighbour does not answer within `timeout`.
  static int64_t agreeOnResumeStep(Mailbox& mailbox, MailboxStageLink& link,
                                   std::vector<int64_t> own_steps, std::chrono::milliseconds timeout);

 private:
  NodeRunnerConfig config_;
  Mailbox& mailbox_;
  MailboxStageLink& link_;
  RingClusterSync* cluster_sync_;
  std::unique_ptr<StageTrainer> trainer_;
};

}  // namespace cairn
