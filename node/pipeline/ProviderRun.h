// ProviderRun: one node's training run as `provider` does it, from a node_data folder to
// nodes/<name>/{trained_stage.pt, result.json}: read node.json and job.json, set up the transport
// (CurveZMQ unless insecure), the rings (RingClusterSync), the pipeline link (MailboxStageLink) and
// the NodeRunner, train, write the results. Used by `provider --name` (the static flow) and by
// `provider --join` once the coordinator's assignment is written into the volunteer's work folder.
//
// Ownership: runProvider owns everything it builds (its own zmq::context_t, the transport, the
// ZAP authenticator) and releases it before returning. Thread-safety: call from one thread;
// `stop_requested` is polled from the trainer's thread between steps.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/NodeData.h"

namespace cairn {

class ChunkSource;  // trainer/data/ServedDataset.h
class SendPacer;    // core/SendPacer.h

// Applies an updated node.json's peers to the running transport (node/transport/LivePeers.h); returns
// "name at host:port" for each peer re-pointed.
using LivePeersApply = std::function<std::vector<std::string>(const NodeSpec& updated)>;

struct ProviderRunOptions {
  std::string node_data;  // folder with job.json and nodes/<name>/
  std::string name;       // node name, e.g. "node_3"
  bool resume = false;    // --resume: restart from the cluster's newest common checkpoint
  bool insecure = false;  // --insecure: plain TCP, no CurveZMQ
  // --device: where the stage trains (trainer/Device.h): auto | cpu | cuda | cuda:N. Resolved
  // when the run starts; a device this build or machine lacks is BadInput (exit 2).
  std::string device = "auto";
  // At most this many torch intra-op threads, whatever job.json's `threads` asks (provider
  // --join --cores: the volunteer's limit); 0: job.json's.
  int max_threads = 0;
  // Neighbours and ring peers on loopback addresses over the same-host socket (docs/PROTOCOL.md
  // "Same-host links"). provider --join turns it off: a spare replacing a volunteer comes with a
  // new key, and only CURVE's handshake keeps its first messages from the neighbours' transports
  // of before the replacement (they admit the old key until they restart with the new peers).
  bool same_host_links = true;
  // Empty: bind node.address. Otherwise what to bind ("host:port", `provider --listen`) while the
  // peers dial node.address (the advertised address).
  std::string bind_address;
  // Polled between steps; true asks for a clean stop at a step boundary (a signal).
  std::function<bool()> stop_requested;
  // A stop this node asks for hands its stage over (StageTrainerConfig::stop_hands_over): the
  // rest of the cluster waits for its replacement. provider --join: true.
  bool stop_hands_over = false;
  // provider --join (node/volunteer/VolunteerPeers.h): once the transport is up, given the function that
  // re-points peers live; given an empty one before the transport closes. Called on the run's
  // thread; the function it is given may be called from any thread while it is set.
  std::function<void(LivePeersApply)> on_live_peers;
  // provider --join (VolunteerPeers::replacedHook): true for a pipeline neighbour that the
  // coordinator gave to another volunteer (a peers update names its new holder): a wait on it ends
  // at once as its loss (MailboxStageLink::setReplaced), so the cluster pauses and this node runs
  // its stage again with the new peers instead of waiting on the old holder. Any thread.
  std::function<bool(const std::string& neighbour)> neighbour_replaced;
  // provider --join streams these to the coordinator (node/volunteer/VolunteerMetrics.h); empty: nothing.
  // Called on the trainer's thread, so they must not block. on_record: every record written to
  // metrics.jsonl and its line. on_event: {"plan": {total_steps, steps_per_epoch, batch_size}}
  // once the plan is known, and {"state": paused|resumed|stopped|lost-peer|failed|finished,
  // "message": …} when the node's state changes ("handed-over": this node
  // stopped and leaves; the rest of its cluster waits for its replacement).
  std::function<void(const nlohmann::json& record, const std::string& line)> on_record;
  std::function<void(const nlohmann::json& event)> on_event;
  // provider --join: where a Root of a job with data.source "coordinator" gets its chunks
  // (node/volunteer/ServedChunks.h); null: such a job is refused.
  std::shared_ptr<ChunkSource> chunk_source;
  // provider --join --max-mbps: every message the training transport sends waits its turn here
  // (core/SendPacer.h); null: no cap.
  std::shared_ptr<SendPacer> send_pacer;
  // provider --join: keep local checkpoints from this step on (StageTrainerConfig); empty: none.
  std::function<int64_t()> keep_checkpoints_from;
};

struct ProviderRunOutcome {
  nlohmann::json summary;   // what was written to nodes/<name>/result.json
  std::string result_path;  // nodes/<name>/result.json
  std::string weights_path; // nodes/<name>/trained_stage.pt; empty when stopped (not written)
  bool stopped = false;     // stopped early by stop_requested (its state is in its checkpoint)
  bool handed_over = false; // stopped, and this node handed its stage over (stop_hands_over)
};

// The deal a Root proposes to its ring peers from the start of a run (StageTrainerConfig::
// offered_deal, until a live peers update brings a newer one; trainer/DealChange.h): the offer
// node.json holds (extra.offered_deal: restarted while an offer was undecided), else the deal in
// force when a growth brought it (extra.deal: taken by this Root before it ran its stage again, or
// given with a spare's assignment), proposed as taken; nullopt when node.json has neither.
// Proposing no offer instead, a Root that took the deal and ran its stage again kept every Root
// that missed the sync where it was taken (paused then) from ever agreeing on it and following
// (DealAgreement::taken_before): those dealt epochs one way and the others another (the
// 24-volunteer soak).
std::optional<nlohmann::json> startingOffer(const NodeSpec& node);

// Trains the node; throws cairn::Error (BadInput for bad files, PeerLost for a neighbour lost
// beyond timeouts.max_wait_s) like the provider binary reports them.
ProviderRunOutcome runProvider(const ProviderRunOptions& options);

}  // namespace cairn
