// MailboxStageLink's handshake (node/pipeline/MailboxStageLink.h "connect()"): the hellos, their
// ids (docs/PROTOCOL.md `hello`), and the neighbours that restarted meanwhile.
#include "node/pipeline/MailboxStageLink.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "node/protocol/PipelineControl.h"
#include "node/transport/LivePeers.h"

namespace cairn {

void MailboxStageLink::connect(std::optional<std::chrono::milliseconds> timeout,
                               const std::string& timeout_key) {
  lost_.reset();
  ++hello_id_.handshake;
  std::vector<std::pair<Neighbour, PeerRef>> neighbours;
  if (node_.upstream) neighbours.emplace_back(Neighbour::kUpstream, *node_.upstream);
  if (node_.downstream) neighbours.emplace_back(Neighbour::kDownstream, *node_.downstream);
  for (const auto& [dir, p] : neighbours)
    mailbox_.transport().addPeer(p.name, transportEndpointOf(p));
  const auto wait = timeout.value_or(timeouts_.startup);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  auto unreachable = [&](Neighbour dir, const PeerRef& p, const char* what) {
    CAIRN_THROW(PeerLost, timeout ? "" : "startup timeout: ", what, " ", toString(dir),
                " neighbour ", p.name, " at ", whereIs(p), " within ", secondsOf(wait), " s (",
                timeout_key, "); is its provider running?");
  };
  mailbox_.purge([&](const Message& m) { return isRepeatedHello(m); });
  const std::set<std::string> redialed =
      handshakes_ > 0 ? redialRestarted(neighbours) : std::set<std::string>{};
  for (const auto& [dir, p] : neighbours) {
    const Message said = hello(p.name);
    CAIRN_INFO("waiting for ", toString(dir), " neighbour ", p.name, " at ", whereIs(p));
    SendStatus status = SendStatus::kTimedOut;
    // In slices so a stop request (signal) is seen while a neighbour is still away.
    while ((status = mailbox_.send(p.name, said, std::min(left(), std::chrono::milliseconds(500)))) ==
               SendStatus::kTimedOut &&
           left() > std::chrono::milliseconds(0)) {
      if (interrupted_ && interrupted_()) CAIRN_THROW(Interrupted, "stopped by a signal while waiting for ", p.name);
    }
    if (status != SendStatus::kSent) unreachable(dir, p, "could not reach");
  }
  for (const auto& [dir, p] : neighbours) {
    std::optional<Message> got = awaitHello(dir, p, deadline);
    if (!got) unreachable(dir, p, "no hello from");
    if (isControl(*got, kCheckpointStepsTag) && got->job_id == node_.job_id) {
      CAIRN_INFO(toString(dir), " neighbour ", p.name, " is up (already agreeing on the resume step)");
      mailbox_.putBack(std::move(*got));
      continue;
    }
    if (got->job_id != node_.job_id)
      CAIRN_THROW(BadInput, toString(dir), " neighbour ", p.name, " runs job \"", got->job_id,
                  "\" but this node runs \"", node_.job_id, "\" (mixed node_data folders?)");
    takeHello(dir, p, *got, redialed, left());
    CAIRN_INFO(toString(dir), " neighbour ", p.name, " is up");
  }
  ++handshakes_;
}

std::optional<Message> MailboxStageLink::awaitHello(Neighbour dir, const PeerRef& p,
                                                    std::chrono::steady_clock::time_point deadline) {
  const std::string name = p.name;
  // A downstream neighbour that already shook hands with this node's previous run (its hello
  // went to the transport this node had before it restarted with new peers) is past its
  // handshake and sends "ckpt_steps" (the resume agreement): that says it is up too. It stays
  // in the mailbox for the agreement. A repeated hello (isRepeatedHello) is taken and dropped.
  const bool downstream = dir == Neighbour::kDownstream;
  auto up = [&](const Message& m) {
    return m.sender == name &&
           (isControl(m, kHelloTag) || (downstream && isControl(m, kCheckpointStepsTag)));
  };
  // In slices: the mailbox asks `interrupted` only when woken early (a liveness change, a
  // signal), and a stop asked without a signal (new peers for a paused node) wakes nothing.
  for (;;) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    std::optional<Message> got = mailbox_.receive(up, std::min(left, std::chrono::milliseconds(500)),
                                                  [&] { return interrupted_ && interrupted_(); });
    if (got && !isRepeatedHello(*got)) return got;
    if (!got && interrupted_ && interrupted_())
      CAIRN_THROW(Interrupted, "stopped by a signal while waiting for ", name);
    if (!got && left <= std::chrono::milliseconds(0)) return std::nullopt;
  }
}

Message MailboxStageLink::hello(const std::string& peer) const {
  Hello h{node_.stage, node_.cluster, hello_id_, {}};
  if (const auto it = heard_.find(peer); it != heard_.end()) h.heard = it->second;
  return encode(ControlOrigin{node_.job_id, node_.name}, h);
}

bool MailboxStageLink::isRepeatedHello(const Message& m) const {
  if (!isControl(m, kHelloTag)) return false;
  const auto it = heard_.find(m.sender);
  if (it == heard_.end() || !it->second.known()) return false;
  const std::optional<Hello> h = decodeHello(m, nullptr);
  return h && h->id == it->second;
}

void MailboxStageLink::takeHello(Neighbour dir, const PeerRef& p, const Message& m,
                                 const std::set<std::string>& redialed,
                                 std::chrono::milliseconds left) {
  const std::optional<Hello> h = decodeHello(m, nullptr);  // malformed ids: an older node's hello
  const HelloId before = heard_[p.name];
  heard_[p.name] = h ? h->id : HelloId{};
  if (!h || !h->id.known() || !before.known() || before.run == h->id.run || h->heard == hello_id_ ||
      redialed.count(p.name))
    return;
  CAIRN_INFO(toString(dir), " neighbour ", p.name, " restarted after this node said hello, and "
             "its hello does not answer this node's: dialling it again and saying hello again (the "
             "first may have gone to its previous process)");
  mailbox_.transport().redial(p.name);
  const SendStatus status =
      mailbox_.send(p.name, hello(p.name), std::clamp(left, std::chrono::milliseconds(1000),
                                                      std::chrono::milliseconds(10000)));
  if (status != SendStatus::kSent)
    CAIRN_WARN("could not say hello again to ", p.name, " (", toString(status), "); it waits for "
               "this node's first hello until its own startup timeout");
}

std::set<std::string> MailboxStageLink::redialRestarted(
    const std::vector<std::pair<Neighbour, PeerRef>>& neighbours) {
  std::set<std::string> redialed;
  for (const auto& [dir, p] : neighbours) {
    const std::string name = p.name;
    std::optional<Message> hello = mailbox_.receive(
        [&](const Message& m) {
          return m.sender == name && isControl(m, kHelloTag) && !isRepeatedHello(m);
        },
        std::chrono::milliseconds(0));
    if (!hello) continue;
    mailbox_.putBack(std::move(*hello));  // for the wait below
    CAIRN_INFO(toString(dir), " neighbour ", name,
               " restarted (its hello is here): dialling it again, so this node's hello reaches "
               "its new process");
    mailbox_.transport().redial(name);
    redialed.insert(name);
  }
  return redialed;
}

}  // namespace cairn
