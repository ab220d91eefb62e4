#include "node/MailboxStageLink.h"

#include <thread>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"

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

double seconds(std::chrono::milliseconds ms) { return double(ms.count()) / 1000.0; }

}  // namespace

MailboxStageLink::MailboxStageLink(Mailbox& mailbox, const NodeSpec& node, LinkTimeouts timeouts)
    : mailbox_(mailbox), node_(node), timeouts_(timeouts) {}

const PeerRef& MailboxStageLink::peer(Neighbour n) const {
  const auto& p = n == Neighbour::kUpstream ? node_.upstream : node_.downstream;
  CAIRN_ENFORCE(p.has_value(), node_.name, " has no ", toString(n), " neighbour");
  return *p;
}

void MailboxStageLink::connect() {
  std::vector<std::pair<Neighbour, PeerRef>> neighbours;
  if (node_.upstream) neighbours.emplace_back(Neighbour::kUpstream, *node_.upstream);
  if (node_.downstream) neighbours.emplace_back(Neighbour::kDownstream, *node_.downstream);
  for (const auto& [dir, p] : neighbours)
    mailbox_.transport().addPeer(p.name, "tcp://" + p.address);
  const auto deadline = std::chrono::steady_clock::now() + timeouts_.startup;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  auto unreachable = [&](Neighbour dir, const PeerRef& p, const char* what) {
    CAIRN_THROW(PeerLost, "startup timeout: ", what, " ", toString(dir), " neighbour ", p.name,
                " at ", p.address, " within ", seconds(timeouts_.startup),
                " s (training_definition.timeouts.startup_s); is its provider running?");
  };
  for (const auto& [dir, p] : neighbours) {
    Message hello;
    hello.kind = MessageKind::kControl;
    hello.job_id = node_.job_id;
    hello.sender = node_.name;
    hello.tag = "hello";
    hello.text = nlohmann::json{{"stage", node_.stage}, {"cluster", node_.cluster}}.dump();
    CAIRN_INFO("waiting for ", toString(dir), " neighbour ", p.name, " at ", p.address);
    if (mailbox_.send(p.name, hello, left()) != SendStatus::kSent)
      unreachable(dir, p, "could not reach");
  }
  for (const auto& [dir, p] : neighbours) {
    const std::string name = p.name;
    auto got = mailbox_.receive(
        [&](const Message& m) {
          return m.kind == MessageKind::kControl && m.tag == "hello" && m.sender == name;
        },
        left());
    if (!got) unreachable(dir, p, "no hello from");
    if (got->job_id != node_.job_id)
      CAIRN_THROW(BadInput, toString(dir), " neighbour ", p.name, " runs job \"", got->job_id,
                  "\" but this node runs \"", node_.job_id, "\" (mixed node_data folders?)");
    CAIRN_INFO(toString(dir), " neighbour ", p.name, " is up");
  }
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
  for (const auto& [name, t] : packet.tensors) m.tensors.push_back({name, t.detach().contiguous()});
  const SendStatus status = mailbox_.send(p.name, m, timeouts_.peer);
  if (status != SendStatus::kSent)
    CAIRN_THROW(PeerLost, toString(to), " neighbour ", p.name, " at ", p.address,
                " did not take a ", toString(packet.kind), " message (step ", packet.step,
                ", micro-batch ", packet.microbatch, ") within ", seconds(timeouts_.peer),
                " s (training_definition.timeouts.peer_s): ", toString(status));
}

StagePacket MailboxStageLink::receive(Neighbour from, PacketKind kind, uint64_t step,
                                      uint64_t microbatch, const std::string& tag) {
  const PeerRef& p = peer(from);
  const MessageKind wire = wireKind(kind);
  auto got = mailbox_.receive(
      [&](const Message& m) {
        return m.kind == wire && m.sender == p.name && m.step == step &&
               m.microbatch == microbatch && m.tag == tag && m.job_id == node_.job_id;
      },
      timeouts_.peer);
  if (!got)
    CAIRN_THROW(PeerLost, toString(from), " neighbour ", p.name, " at ", p.address, " sent no ",
                toString(kind), tag.empty() ? "" : " \"" + tag + "\"", " message for step ", step,
                ", micro-batch ", microbatch, " within ", seconds(timeouts_.peer),
                " s (training_definition.timeouts.peer_s)");
  StagePacket packet;
  packet.kind = *packetKind(got->kind);
  packet.step = got->step;
  packet.microbatch = got->microbatch;
  packet.tag = std::move(got->tag);
  packet.text = std::move(got->text);
  for (auto& t : got->tensors) packet.tensors.emplace_back(std::move(t.name), std::move(t.tensor));
  return packet;
}

}  // namespace cairn
