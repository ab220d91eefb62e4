#include "node/pipeline/MailboxStageLink.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/LivePeers.h"
#include "trainer/Int8Boundary.h"
#include "node/protocol/PipelineControl.h"
#include "trainer/ReservedTensors.h"

namespace cairn {
namespace {

MessageKind wireKind(PacketKind k) {
  switch (k) {
    case PacketKind::kActivation:
      return MessageKind::kActivation;
    case PacketKind::kGradient:
      return MessageKind::kGradient;
    case PacketKind::kEvaluation:
      return MessageKind::kEvaluation;
    case PacketKind::kControl:
      return MessageKind::kControl;
  }
  return MessageKind::kControl;
}

std::optional<PacketKind> packetKind(MessageKind k) {
  switch (k) {
    case MessageKind::kActivation:
      return PacketKind::kActivation;
    case MessageKind::kGradient:
      return PacketKind::kGradient;
    case MessageKind::kEvaluation:
      return PacketKind::kEvaluation;
    case MessageKind::kControl:
      return PacketKind::kControl;
    default:
      return std::nullopt;
  }
}

}  // namespace

uint64_t LinkStats::droppedTotal() const {
  uint64_t total = 0;
  for (const auto& [reason, n] : dropped) total += n;
  return total;
}

MailboxStageLink::MailboxStageLink(Mailbox& mailbox, const NodeSpec& node, LinkTimeouts timeouts,
                                   LinkChecks checks)
    : mailbox_(mailbox), node_(node), timeouts_(timeouts), lost_after_(timeouts.lost), checks_(checks) {
  for (const RingSpec& ring : node_.rings)
    if (ring.members.size() > 1) lost_after_ = std::min(timeouts_.lost, timeouts_.lost_sharing_rings);
  // This link's run: random, so a restarted process (or a new transport) says hello anew.
  std::random_device entropy;
  char run[17];
  std::snprintf(run, sizeof run, "%08x%08x", entropy(), entropy());
  hello_id_.run = run;
  max_message_bytes_ = checks_.max_message_bytes;
  if (max_message_bytes_ == 0) max_message_bytes_ = plannedMessageBytes(node_, checks_);
  if (max_message_bytes_ == 0) max_message_bytes_ = UINT64_MAX;
}

std::optional<std::string> MailboxStageLink::rejectReason(const Message& m, uint64_t awaited_step,
                                                          bool deep, std::string* detail) const {
  return rejectPipelineMessage(m, PipelineExpectations{node_, checks_, max_message_bytes_},
                               awaited_step, deep, detail);
}

void MailboxStageLink::drop(const Message& m, const std::string& reason, const std::string& detail) {
  const uint64_t n = ++stats_.dropped[reason];
  if (logWorthy(n, 5))
    CAIRN_WARN("dropped a ", toString(m.kind), " message from ", m.sender, " (step ", m.step,
               ", micro-batch ", m.microbatch, "): ", reason, ": ", detail, " [", n, " so far]");
  if (reason == "nonfinite" && checks_.stop_on_nonfinite)
    CAIRN_THROW(BadInput, "peer ", m.sender, " sent a ", toString(m.kind), " message (step ", m.step,
                ", micro-batch ", m.microbatch, ") with ", detail,
                "; stopping (training_definition.nonfinite = \"stop\")");
}

const PeerRef& MailboxStageLink::peer(Neighbour n) const {
  const auto& p = n == Neighbour::kUpstream ? node_.upstream : node_.downstream;
  CAIRN_ENFORCE(p.has_value(), node_.name, " has no ", toString(n), " neighbour");
  return *p;
}

bool MailboxStageLink::isNeighbour(const std::string& name) const {
  return (node_.upstream && name == node_.upstream->name) ||
         (node_.downstream && name == node_.downstream->name);
}

void MailboxStageLink::throwLost(const PeerRef& p, Neighbour dir, PeerLoss lost,
                                 const std::string& what) {
  std::string how;
  if (lost.cause == LossCause::kDisconnected && lost.reason == kReplacedReason)
    how = "the coordinator gave its node to another volunteer (a peers update names the new one)";
  else if (lost.cause == LossCause::kDisconnected && lost_after_ < timeouts_.lost)
    how = detail::concat("its connection has been down for ", secondsOf(lost_after_),
                         " s (this node shares rings with other clusters, whose syncs would wait "
                         "for it: lost sooner than training_definition.timeouts.peer_timeout_s, ",
                         secondsOf(timeouts_.lost), " s)");
  else if (lost.cause == LossCause::kDisconnected)
    how = detail::concat("its connection has been down for ", secondsOf(timeouts_.lost),
                         " s (training_definition.timeouts.peer_timeout_s)");
  else if (lost.cause == LossCause::kLeft)
    how = "it is leaving (" + (lost.reason.empty() ? std::string("no reason given") : lost.reason) + ")";
  else
    how = "it restarted (said hello again)";
  lost_ = lost;
  CAIRN_THROW_LOST(std::move(lost), toString(dir), " neighbour ", p.name, " at ", whereIs(p),
                   " is lost: ", how, "; was waiting for ", what);
}

void MailboxStageLink::checkConnection(const PeerRef& p, Neighbour dir, const std::string& what) {
  if (replaced_ && replaced_(p.name))
    throwLost(p, dir, PeerLoss{p.name, LossCause::kDisconnected, kReplacedReason, p.name}, what);
  const PeerLiveness live = mailbox_.transport().liveness(p.name);
  if (live.state != PeerState::kDisconnected || std::chrono::steady_clock::now() - live.since < lost_after_)
    return;
  // Gone after saying it leaves (a send waits on it, which does not read the mailbox): its
  // "leaving" says why (a stop stops this node too), not a silent loss.
  std::optional<Message> leaving = mailbox_.receive(
      [&](const Message& m) { return m.sender == p.name && isControl(m, kLeavingTag); }, std::chrono::milliseconds(0));
  if (leaving) throwRecovery(std::move(*leaving), what);
  throwLost(p, dir, PeerLoss{p.name, LossCause::kDisconnected, "", p.name}, what);
}

void MailboxStageLink::announceLeaving(const std::string& reason, const std::string& lost,
                                       const std::string& except, std::chrono::milliseconds timeout) {
  for (const auto* p : {&node_.upstream, &node_.downstream}) {
    if (!p->has_value() || (*p)->name == except) continue;
    const Message m = encode(ControlOrigin{node_.job_id, node_.name}, Leaving{reason, lost});
    const SendStatus status = mailbox_.send((*p)->name, m, timeout);
    CAIRN_INFO("told ", (*p)->name, " this node is leaving (", reason, "): ", toString(status));
  }
}

size_t MailboxStageLink::purgeStale() {
  const size_t n = mailbox_.purge([&](const Message& m) {
    if (!isNeighbour(m.sender)) return false;
    if (m.kind == MessageKind::kControl)
      return m.tag != kHelloTag && m.tag != kCheckpointStepsTag && m.tag != kResumeAtTag;
    return carriesTensors(m.kind);
  });
  if (n) CAIRN_INFO("dropped ", n, " buffered pipeline messages of the abandoned run");
  return n;
}

void MailboxStageLink::send(Neighbour to, const StagePacket& packet) {
  const PeerRef& p = peer(to);
  Message m;
  m.kind = wireKind(packet.kind);
  m.job_id = node_.job_id;
  m.sender = node_.name;
  m.step = packet.step;
  m.microbatch = packet.microbatch;
  m.tag = packet.tag;
  m.text = packet.text;
  for (const auto& [name, t] : packet.tensors) {
    // training_definition.wire.activations: boundary float32 tensors travel compressed.
    const std::optional<torch::Tensor> wire = wireForm(checks_.wire_float, packet.kind, name, t);
    m.tensors.push_back({name, wire ? wire->contiguous() : t.detach().contiguous()});
  }
  // In slices, so a neighbour whose connection went down is declared lost after lost_after_
  // instead of blocking the whole peer timeout (a send waits only while the peer's queue is full
  // or its connection is down).
  const auto deadline = std::chrono::steady_clock::now() + timeouts_.peer;
  const std::string what = std::string("room for a ") + toString(packet.kind) + " message (step " +
                           std::to_string(packet.step) + ")";
  SendStatus status = SendStatus::kTimedOut;
  std::optional<std::chrono::steady_clock::time_point> stop_seen;
  for (;;) {
    checkConnection(p, to, what);
    checkStopWhileWaiting(p, what, &stop_seen);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    status = mailbox_.send(p.name, m, std::clamp(left, std::chrono::milliseconds(0),
                                                 std::chrono::milliseconds(500)));
    if (status != SendStatus::kTimedOut || std::chrono::steady_clock::now() >= deadline) break;
  }
  if (status != SendStatus::kSent) lost_ = PeerLoss{p.name, LossCause::kSilent, "", p.name};
  if (status != SendStatus::kSent)
    CAIRN_THROW_LOST(*lost_, toString(to), " neighbour ", p.name, " at ", whereIs(p),
                " did not take a ", toString(packet.kind), " message (step ", packet.step,
                ", micro-batch ", packet.microbatch, ") within ", secondsOf(timeouts_.peer),
                " s (training_definition.timeouts.peer_s): ", toString(status));
}

MailboxStageLink::Screened MailboxStageLink::screen(const Message& m, const PeerRef& p,
                                                   MessageKind wire, uint64_t step,
                                                   uint64_t microbatch,
                                                   const std::string& tag) const {
  Screened s;
  // Pipeline traffic is ours to screen: tensor kinds from anyone, control from neighbours.
  if (!carriesTensors(m.kind) && !(isNeighbour(m.sender) && m.kind == MessageKind::kControl))
    return s;
  s.rejected = rejectReason(m, step, /*deep=*/false, &s.detail);
  if (s.rejected) {
    s.take = true;  // taken out of the mailbox to be dropped
  } else if (isRepeatedHello(m)) {
    s.take = s.repeat = true;
  } else if (isControl(m, kLeavingTag) || isControl(m, kHelloTag)) {
    s.take = s.recovery = true;
  } else {
    s.take = m.kind == wire && m.sender == p.name && m.step == step &&
             m.microbatch == microbatch && m.tag == tag;
  }
  return s;
}

std::optional<StagePacket> MailboxStageLink::tryReceive(Neighbour from, PacketKind kind,
                                                        uint64_t step, uint64_t microbatch,
                                                        const std::string& tag) {
  const PeerRef& p = peer(from);
  const MessageKind wire = wireKind(kind);
  // A read without waiting takes at most one message off the transport: read on while messages
  // that are not this one arrive (a ring's, a heartbeat's), up to kMostReads of them.
  constexpr int kMostReads = 64;
  for (int read = 0; read < kMostReads; ++read) {
    const size_t kept = mailbox_.buffered();
    Screened screened;
    std::optional<Message> got = mailbox_.receive(
        [&](const Message& m) {
          screened = screen(m, p, wire, step, microbatch, tag);
          return screened.take;
        },
        std::chrono::milliseconds(0));
    if (!got) {
      if (mailbox_.buffered() > kept) continue;  // one that was not ours came in: read on
      return std::nullopt;
    }
    if (screened.repeat) continue;  // dropped: says nothing new (takeHello)
    if (!screened.recovery && !screened.rejected &&
        !rejectReason(*got, step, /*deep=*/true, &screened.detail)) {
      ++stats_.accepted;
      return unpack(std::move(*got));
    }
    // A message to drop or a neighbour's recovery: receive() handles it, as when it waits.
    mailbox_.putBack(std::move(*got));
    return std::nullopt;
  }
  return std::nullopt;
}

StagePacket MailboxStageLink::receive(Neighbour from, PacketKind kind, uint64_t step,
                                      uint64_t microbatch, const std::string& tag) {
  const PeerRef& p = peer(from);
  const MessageKind wire = wireKind(kind);
  const auto began = std::chrono::steady_clock::now();
  auto deadline = began + timeouts_.peer;
  bool extended = false;  // past `peer`, waiting on because the neighbour is still connected
  const std::string what = std::string(toString(kind)) + (tag.empty() ? "" : " \"" + tag + "\"") +
                           " message for step " + std::to_string(step) + ", micro-batch " +
                           std::to_string(microbatch);
  std::optional<Message> got;
  std::optional<std::chrono::steady_clock::time_point> stop_seen;
  for (;;) {
    // The awaited neighbour down for lost_after_ ends the wait; wake up when it reaches that, or
    // on the next liveness change. (The other neighbour's loss is seen when this node next sends
    // to it or waits for it, or through its "leaving".) A stop request is looked at every 0.5 s.
    auto wake = deadline;
    if (interrupted_ || replaced_)
      wake = std::min(wake, std::chrono::steady_clock::now() + std::chrono::milliseconds(500));
    checkConnection(p, from, what);
    checkStopWhileWaiting(p, what, &stop_seen);
    const PeerLiveness live = mailbox_.transport().liveness(p.name);
    if (live.state == PeerState::kDisconnected) wake = std::min(wake, live.since + lost_after_);
    Screened screened;
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   wake - std::chrono::steady_clock::now()) +
                                   std::chrono::milliseconds(1));
    got = mailbox_.receive(
        [&](const Message& m) {
          screened = screen(m, p, wire, step, microbatch, tag);
          return screened.take;
        },
        left, [] { return true; });  // back to the checks above on every liveness change
    if (got && screened.recovery) throwRecovery(std::move(*got), what);
    if (got && screened.repeat) {  // dropped: says nothing new (takeHello)
      got.reset();
      continue;
    }
    if (!got && std::chrono::steady_clock::now() < deadline) continue;
    if (!got && !extended && timeouts_.connected > timeouts_.peer &&
        mailbox_.transport().liveness(p.name).state == PeerState::kConnected) {
      extended = true;
      deadline = began + timeouts_.connected;
      CAIRN_WARN(toString(from), " neighbour ", p.name, " is connected but sent no ", what, " for ",
                 secondsOf(timeouts_.peer), " s (training_definition.timeouts.peer_s); waiting up to ",
                 secondsOf(timeouts_.connected), " s in all (timeouts.max_wait_s): it may be in a "
                 "cross-cluster sync whose ring waits for a member");
      continue;
    }
    if (!got) break;
    std::optional<std::string>& rejected = screened.rejected;
    if (!rejected) rejected = rejectReason(*got, step, /*deep=*/true, &screened.detail);
    if (!rejected) break;
    drop(*got, *rejected, screened.detail);
    got.reset();
  }
  if (got) ++stats_.accepted;
  if (!got) lost_ = PeerLoss{p.name, LossCause::kSilent, "", p.name};
  if (!got)
    CAIRN_THROW_LOST(*lost_, toString(from), " neighbour ", p.name, " at ", whereIs(p), " sent no ",
                toString(kind), tag.empty() ? "" : " \"" + tag + "\"", " message for step ", step,
                ", micro-batch ", microbatch, " within ", secondsOf(extended ? timeouts_.connected : timeouts_.peer),
                extended ? " s, connected all along (training_definition.timeouts.max_wait_s)"
                         : " s (training_definition.timeouts.peer_s)");
  return unpack(std::move(*got));
}

void MailboxStageLink::checkStopWhileWaiting(
    const PeerRef& p, const std::string& what,
    std::optional<std::chrono::steady_clock::time_point>* stop_seen) const {
  if (!interrupted_ || !interrupted_()) return;
  const auto now = std::chrono::steady_clock::now();
  if (!*stop_seen) *stop_seen = now;
  if (now - **stop_seen < timeouts_.lost) return;
  CAIRN_THROW(Interrupted, "a stop was asked and, ", secondsOf(timeouts_.lost),
              " s later (training_definition.timeouts.peer_timeout_s), this node still waits for ", what,
              " (neighbour ", p.name, " at ", whereIs(p), "): it leaves without ending the step; its "
              "newest checkpoint keeps its work");
}

void MailboxStageLink::throwRecovery(Message m, const std::string& what) {
  const Neighbour dir = node_.upstream && m.sender == node_.upstream->name ? Neighbour::kUpstream
                                                                            : Neighbour::kDownstream;
  const bool hello = isControl(m, kHelloTag);
  PeerLoss lost{m.sender, hello ? LossCause::kRestarted : LossCause::kLeft, "", m.sender};
  if (const auto leaving = decodeLeaving(m, nullptr)) {
    lost.reason = leaving->reason;
    // A pause spreading along the pipeline names the node that was lost in the first place.
    if (isNeighbour(m.sender) && !leaving->lost.empty()) lost.origin = leaving->lost;
  }
  // The restarted neighbour's hello is for the next handshake (connect()).
  if (hello) mailbox_.putBack(std::move(m));
  throwLost(peer(dir), dir, std::move(lost), what);
}

StagePacket MailboxStageLink::unpack(Message m) const {
  StagePacket packet;
  packet.kind = *packetKind(m.kind);
  packet.step = m.step;
  packet.microbatch = m.microbatch;
  packet.tag = std::move(m.tag);
  packet.text = std::move(m.text);
  const std::vector<BoundaryValue>& planned =
      m.kind == MessageKind::kGradient ? node_.outputs : node_.inputs;
  // The wire form where it is decoded: the training device (decodeOn), else the host.
  auto placed = [this](const torch::Tensor& wire) {
    return decode_on_ ? decode_on_->toDevice(wire) : wire;
  };
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    NamedTensor& t = m.tensors[i];
    // Validated by receive() (rejectReason): a tensor in the wire dtype is a planned float32
    // boundary tensor.
    if (checks_.wire_float == torch::kChar && !isReservedTensorName(t.name) && i < planned.size() &&
        t.tensor.scalar_type() == torch::kByte && planned[i].dtype == "float32") {
      const std::optional<std::vector<int64_t>> shape = int8PlannedShape(planned[i], t.tensor.sizes());
      CAIRN_ENFORCE(shape.has_value(), "a validated int8 wire form of \"", t.name, "\" fits no shape");
      t.tensor = decodeInt8Boundary(placed(t.tensor), *shape);
    } else if (checks_.wire_float != torch::kFloat && checks_.wire_float != torch::kChar &&
               !isReservedTensorName(t.name) && t.tensor.scalar_type() == checks_.wire_float) {
      t.tensor = placed(t.tensor).to(torch::kFloat);
    }
    packet.tensors.emplace_back(std::move(t.name), std::move(t.tensor));
  }
  return packet;
}

}  // namespace cairn
