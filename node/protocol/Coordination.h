// Coordination: the messages between volunteers (`provider --join`) and the coordinator
// (`clusterize --serve`), docs/PROTOCOL.md "Coordination". One encode and one validating decode
// per message. This is not the pipeline wire: it runs on its own CurveZMQ connection (a volunteer's
// DEALER to the coordinator's ROUTER; the coordinator's DEALER to a joining volunteer's listen
// address for the reachability check), never on the training hot path.
//
// A message is a list of frames: frame 0 is a JSON object (at most kMaxCoordinationHeaderBytes)
// whose "type" names the message; frames 1… are binary attachments (a stage file, a checkpoint,
// trained weights, probe bytes), each at most the receiver's limit. Every message carries
// "protocol": kCoordinationProtocol.
//
//   volunteer → coordinator
//     join       {token, advertise ("" when none), probe{ram_gb, cores, compute_gflops, bandwidth_mbps, gpus[…],
//                 libtorch}, name?}           ask to take part; `name`: the name a restarted
//                                             volunteer held before (it keeps its key); `probe`:
//                                             VolunteerProbeCodec.h (GPUs, libtorch version)
//                 relay?{mbps}                a volunteer that only relays (provider --relay):
//                                             its relay answers at `advertise`; mbps its cap
//                                             (0: none)
//     bandwidth  {bytes} + 1 attachment       bandwidth probe: `bytes` must equal its size
//     heartbeat  {name, state, step, relay?{messages, bytes, waiting, refused}}
//                                             every few seconds; state: waiting|training|done|
//                                             relaying|…; relay: a relay's figures so far
//     result     {name, summary{…}} + 1 attachment (trained_stage.pt)
//     checkpoint {name, step, checksum} + 1 attachment (the stage's checkpoint file)
//     leaving    {name, reason}               a clean stop (signal): replace me
//     metrics    {name, stream, seq, records[…], dropped}  the trainer's records (metrics.jsonl
//                                             lines, state changes), numbered from `seq` within
//                                             `stream` (one per volunteer process); answered by
//                                             metrics_ack
//   coordinator → volunteer
//     accepted   {name, state, note?, reachability?}  joined; `state` is "spare" until it is
//                                             assigned; reachability: present when the dial-back
//                                             failed or there was no address (dial-out only)
//     rejected   {reason, node_taken?}        not joined (the volunteer prints the reason, exits 2);
//                                             to a member's heartbeat or upload: not taken, and
//                                             node_taken: true when its node was given to a spare
//                                             while it was lost (it gives the node up, joins again)
//     bandwidth_ack {bytes}
//     assignment {name, node{node.json}, job{job.json}, num_clusters, resume} + 1 or 2
//                 attachments: stage.pt, and the newest checkpoint when `resume` is true
//     peers      {name, node{node.json}}      the node's updated neighbours / ring peers
//     relay_links {name, members{name: key}, links[[a, b]…]}  what a relay (state "relaying")
//                                             admits and forwards now: the members' keys and the
//                                             planned pairs through it (each name a member)
//     result_ack {name}
//     checkpoint_ack {name, step, keep_from?} the checkpoint of `name` it holds is `step` (the
//                                             last one sent: an older one after a resume too);
//                                             keep_from: keep every local checkpoint of a step >=
//                                             it (the oldest of the newest checkpoints the
//                                             coordinator holds for the placed nodes, 0 while one
//                                             has none): a spare given one of those resumes with
//                                             its neighbours at that step
//     metrics_ack {name, stream, seq}         every record of `stream` before `seq` is held
//     finished   {reason}                     the run is over; the volunteer may exit
//   coordinator → volunteer's listen address (reachability check)
//     reach      {nonce}                      answered with
//     reach_ok   {nonce}
//
// Decoding never throws: a malformed message yields nullopt and the reason (type, key and what
// was expected). Whether a token, name or figure is acceptable is the coordinator's business.
// Ownership: plain values. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/Fnv.h"  // fnv1a64: checkpoint uploads carry it
#include "node/protocol/VolunteerProbeCodec.h"  // VolunteerProbe: the join's `probe`

namespace cairn {

// The longest node name a coordination or chunk message may carry.
inline constexpr size_t kMaxNodeNameBytes = 128;

constexpr int kCoordinationProtocol = 1;
constexpr size_t kMaxCoordinationHeaderBytes = 1 << 20;  // node.json of a big stage fits
constexpr size_t kMaxReasonBytes = 512;
constexpr size_t kMaxNoteBytes = 4096;  // accepted.note

// The frames of one coordination message: [0] the JSON header, [1…] attachments.
using Frames = std::vector<std::string>;

struct JoinAsk {
  std::string token;
  std::string advertise;  // host:port peers dial; empty: none (dial-out only, no --listen)
  VolunteerProbe probe;
  std::string name;       // empty: a new volunteer
  // provider --relay [--relay-mbps N]: this volunteer only relays (node/transport/Relay.h at
  // `advertise`); the value is its cap in Mbit/s, 0: none. nullopt: it trains.
  std::optional<double> relay_mbps = std::nullopt;
};
constexpr double kMaxRelayMbps = 1e6;
struct BandwidthProbeMsg {
  std::string payload;
};
// A relay's figures since it started (node/transport/Relay.h RelayStats), in its heartbeats.
struct RelayFigures {
  int64_t messages = 0, bytes = 0;  // forwarded
  int64_t waiting = 0;              // bytes waiting in its queues now
  int64_t refused = 0;              // messages refused or dropped, every reason
};
struct Heartbeat {
  std::string name;
  std::string state;
  int64_t step = 0;
  std::optional<RelayFigures> relay = std::nullopt;  // a relay's (state "relaying")
};
struct ResultUpload {
  std::string name;
  nlohmann::json summary;  // the provider's result.json
  std::string trained_stage;
};
struct CheckpointUpload {
  std::string name;
  int64_t step = 0;
  uint64_t checksum = 0;  // FNV-1a 64 of `file`
  std::string file;
};
struct LeavingNotice {
  std::string name;
  std::string reason;
};

// The trainer's records in the background (node/volunteer/VolunteerMetrics.h): record i has number seq + i
// in `stream`; `dropped`: records this stream has dropped so far (its queue was full).
struct MetricsBatch {
  std::string name;
  std::string stream;  // 1-64 characters [0-9a-z], new for every volunteer process
  int64_t seq = 0;
  std::vector<nlohmann::json> records;  // JSON objects
  int64_t dropped = 0;
};
constexpr size_t kMaxMetricsRecords = 4096;  // per message (and the header's 1 MiB)

struct Accepted {
  std::string name;
  std::string state;  // "spare" | "assigned"
  std::string note;   // optional (may be empty): for a spare, why it waits (no stage fits it, …)
  // optional: set when the coordinator could not dial the volunteer back (it is dial-out only):
  // one line saying so, with what it would take to become reachable (the volunteer prints it).
  std::string reachability;
};
struct Rejected {
  std::string reason;
  // To a member's message (heartbeat, upload): the node it speaks for was given to a spare while
  // it was unreachable (lost); it should give the node up and join again (as a spare).
  bool node_taken = false;
};
struct BandwidthAck {
  int64_t bytes = 0;
};
struct Assignment {
  std::string name;
  nlohmann::json node;  // node.json (validated by the receiver with parseNodeSpec)
  nlohmann::json job;   // job.json (parseJobSpec)
  int64_t num_clusters = 1;
  std::string stage;    // stage.pt bytes
  std::optional<std::string> checkpoint;  // the newest checkpoint file the coordinator holds
  int64_t checkpoint_step = -1;
};
struct PeersUpdate {
  std::string name;
  nlohmann::json node;
};
// What a relay volunteer admits and forwards (node/transport/Relay.h setLinks).
struct RelayLinksUpdate {
  std::string name;                           // the relay member's
  std::map<std::string, std::string> members;  // node name → Z85 public key
  std::set<std::pair<std::string, std::string>> links;  // planned pairs, lesser name first
};
constexpr size_t kMaxRelayMembers = 4096;
struct ResultAck {
  std::string name;
};
struct CheckpointAck {
  std::string name;
  int64_t step = 0;  // the newest checkpoint the coordinator holds for `name`
  int64_t keep_from = -1;  // >= 0: keep local checkpoints of steps >= it; -1: not said
};
struct Finished {
  std::string reason;
};
struct MetricsAck {
  std::string name;
  std::string stream;
  int64_t seq = 0;  // the next record number expected: every one before it is held
};
struct ReachCheck {
  std::string nonce;
};
struct ReachOk {
  std::string nonce;
};

using ToCoordinator =
    std::variant<JoinAsk, BandwidthProbeMsg, Heartbeat, ResultUpload, CheckpointUpload, LeavingNotice,
                 MetricsBatch>;
using ToVolunteer =
    std::variant<Accepted, Rejected, BandwidthAck, Assignment, PeersUpdate, ResultAck, Finished,
                 CheckpointAck, MetricsAck, RelayLinksUpdate>;
using ReachMessage = std::variant<ReachCheck, ReachOk>;

Frames encode(const JoinAsk& m);
Frames encode(const BandwidthProbeMsg& m);
Frames encode(const Heartbeat& m);
Frames encode(const ResultUpload& m);
Frames encode(const CheckpointUpload& m);
Frames encode(const LeavingNotice& m);
Frames encode(const MetricsBatch& m);
Frames encode(const MetricsAck& m);
Frames encode(const Accepted& m);
Frames encode(const Rejected& m);
Frames encode(const BandwidthAck& m);
Frames encode(const Assignment& m);
Frames encode(const PeersUpdate& m);
Frames encode(const RelayLinksUpdate& m);
Frames encode(const ResultAck& m);
Frames encode(const CheckpointAck& m);
Frames encode(const Finished& m);
Frames encode(const ReachCheck& m);
Frames encode(const ReachOk& m);

// `max_attachment_bytes` bounds each attachment. nullopt with `*why` set on anything malformed.
std::optional<ToCoordinator> decodeToCoordinator(const Frames& frames, size_t max_attachment_bytes,
                                                 std::string* why);
// A checkpoint's checksum checked by the decoder, or left to its receiver (the coordinator's
// CheckpointWriter checks it on its own thread: FNV-1a over a large upload held the loop).
enum class AttachmentChecksum { kVerify, kLeaveToReceiver };
// The same, with the attachments moved out of `frames` into the message instead of copied (the
// coordinator's loop: a checkpoint, a trained stage or a bandwidth probe can be hundreds of MB).
std::optional<ToCoordinator> decodeToCoordinator(Frames&& frames, size_t max_attachment_bytes,
                                                 std::string* why, AttachmentChecksum checksum);
std::optional<ToVolunteer> decodeToVolunteer(const Frames& frames, size_t max_attachment_bytes,
                                             std::string* why);
std::optional<ReachMessage> decodeReach(const Frames& frames, std::string* why);


// The invite a coordinator prints and a volunteer passes to `provider --join`:
//   cairn-invite:1:<host>:<port>:<coordinator public key, 40 Z85 chars as hex (80)>:<token hex>
// Hex keeps it one shell word without quoting. parseInvite throws BadInput naming what is wrong.
struct Invite {
  std::string host;
  int port = 0;
  std::string coordinator_key;  // Z85
  std::string token;            // hex, 32..128 chars
  std::string address() const { return host + ":" + std::to_string(port); }
};
std::string formatInvite(const Invite& invite);
Invite parseInvite(const std::string& text);

}  // namespace cairn
