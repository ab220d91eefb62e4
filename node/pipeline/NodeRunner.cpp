#include "node/pipeline/NodeRunner.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Log.h"
#include "node/ring/RingClusterSync.h"
#include "node/protocol/PipelineControl.h"
#include "node/transport/LivePeers.h"
#include "trainer/Checkpoint.h"
#include "trainer/TrainerCheckpoints.h"

namespace cairn {
namespace {

ControlOrigin originOf(const MailboxStageLink& link) {
  return ControlOrigin{link.node().job_id, link.node().name};
}

// The control message `tag` from `from`, waited for up to `timeout` and decoded by `decode`
// (node/protocol/PipelineControl.h); a malformed one is a BadInput naming the peer.
// A "hello" from `from` instead (it restarted and starts a fresh handshake: a paused neighbour
// given new peers runs its stage again) goes back into the mailbox and throws NeighbourRestarted.
template <typename Decode>
auto awaitControl(Mailbox& mailbox, const MailboxStageLink& link, const PeerRef& from,
                  const char* tag, std::chrono::milliseconds timeout, Decode decode,
                  const std::function<bool()>& interrupted) {
  // In slices of at most 500 ms: the mailbox asks `interrupted` only when woken early, and a stop
  // asked without a signal (new peers for a paused node) wakes nothing.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<Message> got;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    got = mailbox.receive(
        [&](const Message& m) {
          // A repeated hello (MailboxStageLink::isRepeatedHello) is not a restart: left for
          // the link to drop.
          return (isControl(m, tag) || (isControl(m, kHelloTag) && !link.isRepeatedHello(m))) &&
                 m.sender == from.name && m.job_id == link.node().job_id;
        },
        std::max(std::chrono::milliseconds(0), std::min(left, std::chrono::milliseconds(500))),
        [&] { return interrupted && interrupted(); });
    if (!got && interrupted && interrupted())
      CAIRN_THROW(Interrupted, "stopped by a signal during the resume agreement");
    if (got || left <= std::chrono::milliseconds(500)) break;
  }
  if (got && isControl(*got, kHelloTag)) {
    mailbox.putBack(std::move(*got));
    CAIRN_THROW(NeighbourRestarted, "neighbour ", from.name, " restarted during the resume agreement");
  }
  if (!got)
    CAIRN_THROW(PeerLost, "neighbour ", from.name, " at ", whereIs(from), " sent no \"", tag,
                "\" (resume agreement) within ", secondsOf(timeout),
                " s (training_definition.timeouts.max_wait_s); restart it with `provider --name ",
                from.name, " --resume`");
  std::string why;
  auto decoded = decode(*got, &why);
  if (!decoded) CAIRN_THROW(BadInput, "peer ", from.name, " sent ", why);
  return *decoded;
}

}  // namespace

torch::jit::Module loadStage(const std::string& path) {
  try {
    return torch::jit::load(path);
  } catch (const c10::Error& e) {
    CAIRN_THROW(BadInput, path, ": cannot load the TorchScript stage: ",
                std::string(e.what_without_backtrace()).substr(0, 300));
  }
}

int64_t NodeRunner::agreeOnResumeStep(Mailbox& mailbox, MailboxStageLink& link,
                                      std::vector<int64_t> steps, std::chrono::milliseconds timeout,
                                      const std::function<bool()>& interrupted) {
  const NodeSpec& node = link.node();
  std::sort(steps.begin(), steps.end());
  // Leaf → Root: every node intersects what downstream holds with its own steps.
  if (node.downstream) {
    std::vector<int64_t> theirs =
        awaitControl(mailbox, link, *node.downstream, kCheckpointStepsTag, timeout,
                     decodeCheckpointSteps, interrupted)
            .steps;
    std::sort(theirs.begin(), theirs.end());
    std::vector<int64_t> both;
    std::set_intersection(steps.begin(), steps.end(), theirs.begin(), theirs.end(),
                          std::back_inserter(both));
    steps = std::move(both);
  }
  int64_t step = steps.empty() ? -1 : steps.back();
  if (node.upstream) {
    const SendStatus status = mailbox.send(node.upstream->name,
                                           encode(originOf(link), CheckpointSteps{steps}), timeout);
    if (status != SendStatus::kSent)
      CAIRN_THROW(PeerLost, "upstream neighbour ", node.upstream->name, " did not take \"ckpt_steps\": ",
                  toString(status));
    // Root → Leaf: the Root decides.
    step = awaitControl(mailbox, link, *node.upstream, kResumeAtTag, timeout, decodeResumeAt,
                        interrupted)
               .step;
    if (step != -1 && !std::binary_search(steps.begin(), steps.end(), step))
      CAIRN_THROW(BadInput, "peer ", node.upstream->name, " asks to resume at step ", step,
                  ", which is not among the checkpoints this node and its downstream hold");
  }
  // Everything the neighbours sent before their part of the agreement belongs to the old run.
  link.purgeStale();
  if (node.downstream) {
    const SendStatus status = mailbox.send(node.downstream->name,
                                           encode(originOf(link), ResumeAt{step}), timeout);
    if (status != SendStatus::kSent)
      CAIRN_THROW(PeerLost, "downstream neighbour ", node.downstream->name,
                  " did not take \"resume_at\": ", toString(status));
  }
  return step;
}

NodeRunner::NodeRunner(NodeRunnerConfig config, Mailbox& mailbox, MailboxStageLink& link,
                       RingClusterSync* cluster_sync)
    : config_(std::move(config)), mailbox_(mailbox), link_(link), cluster_sync_(cluster_sync) {
  if (!config_.checkpoint_steps) config_.checkpoint_steps = validCheckpointSteps;
}

NodeRunner::~NodeRunner() = default;

StageTrainer& NodeRunner::trainer() {
  CAIRN_ENFORCE(trainer_ != nullptr, "NodeRunner::trainer() before run()");
  return *trainer_;
}

NodeRunResult NodeRunner::run() {
  NodeRunResult out;
  link_.setInterrupted(config_.trainer.stop_requested);
  try {
    link_.connect();
  } catch (const Interrupted&) {
    CAIRN_WARN("stopped by a signal before training started");
    out.result.stopped = true;
    return out;
  }
  bool resuming = config_.resume;
  for (;;) {
    StageTrainerConfig cfg = config_.trainer;
    if (resuming) {
      const std::optional<int64_t> step = agreeOnResume(out);
      if (!step) return out;  // stopped by a signal during the agreement
      cfg.resume_step = *step;
      if (config_.deal_in_force) {
        try {
          takeDealInForce(&cfg, config_.deal_in_force());
        } catch (const std::exception& e) {
          CAIRN_WARN("resume: could not read the deal in force (", e.what(), "); planning with the run's");
        }
      }
      adoptDealOfCheckpoint(&cfg);
    }
    const TrainerObserver observer = attemptObserver(resuming);
    torch::jit::Module stage = loadStage(config_.stage_path);
    trainer_.reset();
    trainer_ = std::make_unique<StageTrainer>(cfg, std::move(stage), link_, observer);
    try {
      out.result = trainer_->run();
    } catch (const Interrupted& e) {
      leaveMidStep(e, out);
      return out;
    } catch (const PeerLost& e) {
      // Only the loss of a pipeline neighbour pauses the cluster; anything else (a ring member the
      // rings could not do without, a PeerLost without a known peer) ends the run.
      const std::optional<PeerLoss>& lost = e.loss();
      if (!lost || !link_.isNeighbour(lost->peer) || lost->cause == LossCause::kSilent)
        throw;  // a connected but silent neighbour: peer_s
      if (lost->cause == LossCause::kLeft && lost->reason == "stopped") {
        stopWithNeighbour(*lost, out);
        return out;
      }
      if (!pauseUntilBack(e, *lost, out)) return out;  // stopped by a signal while paused
      resuming = true;
      continue;
    }
    if (out.result.stopped && out.result.hand_over && !out.result.stop_asked_here) {
      if (!pauseForHandOver(out)) return out;  // stopped by a signal while paused
      resuming = true;
      continue;
    }
    if (out.result.stopped) {
      const bool hand_over = out.result.hand_over && out.result.stop_asked_here;
      CAIRN_INFO("stopped at step ", out.result.steps, " on request; telling the neighbours",
                 hand_over ? " that this node hands its stage over" : "");
      link_.announceLeaving(hand_over ? kHandOverReason : "stopped");
      if (cluster_sync_) cluster_sync_->leave();
    }
    return out;
  }
}

std::optional<int64_t> NodeRunner::agreeOnResume(NodeRunResult& out) {
  const std::vector<int64_t> own = config_.trainer.checkpoint_dir.empty()
                                       ? std::vector<int64_t>{}
                                       : config_.checkpoint_steps(config_.trainer.checkpoint_dir);
  CAIRN_INFO("resume: this node holds ", own.size(), " valid checkpoint(s)",
             own.empty() ? std::string() : ", newest step " + std::to_string(own.back()),
             "; agreeing on the step with the cluster");
  // A neighbour that restarts meanwhile (it was given new peers while this node was already
  // agreeing) starts a fresh handshake: answer it and agree again, a bounded number of times.
  int64_t step = -1;
  for (int attempt = 1;; ++attempt) {
    try {
      step = agreeOnResumeStep(mailbox_, link_, own, config_.max_wait, config_.trainer.stop_requested);
      break;
    } catch (const Interrupted&) {
      CAIRN_WARN("stopped by a signal during the resume agreement");
      out.result.stopped = true;
      return std::nullopt;
    } catch (const NeighbourRestarted& e) {
      if (attempt >= kMaxAgreementRestarts) throw;
      CAIRN_INFO("resume: ", std::string(e.what()), "; a fresh handshake, then the agreement again");
      try {
        link_.connect(config_.max_wait, "training_definition.timeouts.max_wait_s");
      } catch (const Interrupted&) {
        out.result.stopped = true;
        return std::nullopt;
      }
    }
  }
  if (step < 0)
    CAIRN_WARN("resume: no checkpoint step is held by every node of the cluster; starting "
               "from step 0 (fresh stage.pt)");
  else
    CAIRN_INFO("resume: the cluster agreed on step ", step, "; training resumes from there");
  out.resumed_from = step;
  if (out.pauses > 0 && config_.on_state)
    config_.on_state("resumed", step < 0 ? "from step 0" : "from step " + std::to_string(step));
  if (cluster_sync_) cluster_sync_->setJoining(true);
  return step;
}

TrainerObserver NodeRunner::attemptObserver(bool resuming) const {
  TrainerObserver observer = config_.observer;
  if (resuming) {
    auto logged = std::make_shared<bool>(false);
    observer.on_step_loss = [logged, inner = config_.observer.on_step_loss](int64_t step, double loss) {
      if (!*logged) CAIRN_INFO("resume: first step after resuming done: step ", step, ", loss ", loss);
      *logged = true;
      if (inner) inner(step, loss);
    };
  }
  return observer;
}

void NodeRunner::leaveMidStep(const Interrupted& e, NodeRunResult& out) {
  // A stop asked while a neighbour sends nothing: the step cannot end, so no checkpoint of it; the
  // neighbours hear this node leave as at a clean stop (the whole cluster stops, or, for a
  // hand-over, pauses for the replacement) and resume from the newest common checkpoint.
  const bool hands_over = config_.trainer.stop_hands_over;
  CAIRN_WARN(std::string(e.what()));
  link_.announceLeaving(hands_over ? kHandOverReason : "stopped");
  if (cluster_sync_) cluster_sync_->leave();
  out.result.stopped = true;
  out.result.hand_over = hands_over;
  out.result.stop_asked_here = true;
}

void NodeRunner::stopWithNeighbour(const PeerLoss& lost, NodeRunResult& out) {
  // The neighbour stopped on a signal; the cluster stops with it.
  CAIRN_WARN("neighbour ", lost.peer, " stopped (signal); this node stops too. Restart the "
             "cluster with --resume");
  link_.announceLeaving("stopped", lost.origin, lost.peer);
  if (cluster_sync_) cluster_sync_->leave();
  out.result.stopped = true;
}

bool NodeRunner::pauseForHandOver(NodeRunResult& out) {
  // The stop wrote a checkpoint of its step on every node (whatever checkpoint_every says): the
  // cluster resumes from it with the replacement.
  if (config_.trainer.checkpoint_dir.empty())
    CAIRN_THROW(PeerLost, "a node of this cluster handed its stage over at step ", out.result.steps,
                " but this node keeps no checkpoints, so the cluster cannot resume with its "
                "replacement");
  CAIRN_WARN("the cluster stopped after step ", out.result.steps, " so that a node could hand its "
             "stage over (it leaves); pausing: waiting up to ", secondsOf(config_.max_wait),
             " s for its replacement");
  return waitForHandshake(
      out, "a node handed its stage over after step " + std::to_string(out.result.steps) +
               "; waiting for its replacement",
      [&](const std::string& why) {
        return detail::concat("gave up waiting for the replacement of the node that handed its "
                              "stage over after ", secondsOf(config_.max_wait),
                              " s (training_definition.timeouts.max_wait_s) [", why, "]");
      });
}

bool NodeRunner::waitForHandshake(NodeRunResult& out, const std::string& paused_message,
                                  const std::function<std::string(const std::string&)>& gave_up) {
  if (config_.on_state) config_.on_state("paused", paused_message);
  if (cluster_sync_) cluster_sync_->leave();
  trainer_.reset();
  out.result.stopped = false;
  out.result.hand_over = false;
  try {
    link_.connect(config_.max_wait, "training_definition.timeouts.max_wait_s");
  } catch (const Interrupted&) {
    CAIRN_WARN("asked to stop while paused; a cluster of `provider --name` nodes resumes later with --resume");
    out.result.stopped = true;
    return false;
  } catch (const PeerLost& wait) {
    CAIRN_THROW(PeerLost, gave_up(wait.what()));
  }
  ++out.pauses;
  return true;
}

bool NodeRunner::pauseUntilBack(const PeerLost& e, const PeerLoss& lost, NodeRunResult& out) {
  const bool checkpoints = !config_.trainer.checkpoint_dir.empty() &&
                           config_.trainer.options.checkpoint_every > 0;
  if (!checkpoints)
    CAIRN_THROW(PeerLost, std::string(e.what()), ". Checkpoints are off, so the cluster cannot pause and "
                "resume: set training_definition.checkpoint_every > 0 and restart the cluster");
  CAIRN_WARN("neighbour ", lost.peer, " lost (", toString(lost.cause),
             lost.reason.empty() ? "" : ": " + lost.reason, "): ", std::string(e.what()));
  CAIRN_WARN("pausing: waiting up to ", secondsOf(config_.max_wait), " s for ", lost.origin,
             " to come back (", "provider --name ", lost.origin, " --resume)");
  link_.announceLeaving("paused", lost.origin, lost.peer);
  return waitForHandshake(
      out, "neighbour " + lost.peer + " lost (" + toString(lost.cause) + "); waiting for " + lost.origin,
      [&](const std::string& why) {
        const std::string resume_hint = "provider --name " + config_.trainer.node.name +
                                        " --node-data " + config_.node_data + " --resume";
        return detail::concat("gave up waiting for the lost node ", lost.origin, " after ",
                              secondsOf(config_.max_wait), " s (training_definition.timeouts.max_wait_s) [",
                              why, "]; restart it with `provider --name ", lost.origin,
                              " --resume` and this node with `", resume_hint, "`");
      });
}

}  // namespace cairn
