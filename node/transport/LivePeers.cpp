#include "node/transport/LivePeers.h"

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

std::string transportEndpointOf(const PeerRef& peer) {
  if (peer.relay) return relayedEndpoint(peer.relay->public_key, peer.relay->address);
  if (peer.dial_out_only) return kDialsUsEndpoint;
  return peer.address.find("://") == std::string::npos ? "tcp://" + peer.address : peer.address;
}

std::string whereIs(const PeerRef& peer) {
  if (peer.relay) return "(through the relay " + peer.relay->name + " at " + peer.relay->address + ")";
  return peer.dial_out_only ? "(dial-out only)" : peer.address;
}

std::map<std::string, PeerRef> peersOf(const NodeSpec& node) {
  std::map<std::string, PeerRef> peers;
  auto add = [&](const PeerRef& p) {
    if (p.name != node.name) peers[p.name] = p;
  };
  if (node.upstream) add(*node.upstream);
  if (node.downstream) add(*node.downstream);
  for (const RingSpec& ring : node.rings)
    for (const PeerRef& member : ring.members) add(member);
  return peers;
}

LivePeers::LivePeers(ZmqTransport& transport, ZapAuthenticator* zap, const NodeSpec& node)
    : transport_(transport), zap_(zap), name_(node.name), peers_(peersOf(node)) {}

std::vector<std::string> LivePeers::apply(const NodeSpec& updated, std::vector<std::string>* repointed) {
  if (updated.name != name_)
    CAIRN_THROW(BadInput, "peers update for ", updated.name, " given to the run of ", name_);
  const std::map<std::string, PeerRef> next = peersOf(updated);
  if (zap_)
    for (const auto& [name, p] : next)
      if (!isZ85Key(p.public_key))
        CAIRN_THROW(BadInput, "peers update for ", name_, ": peer ", name, " has no CURVE public key");
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> moved;
  for (const auto& [name, p] : next) {
    auto it = peers_.find(name);
    if (it != peers_.end() && it->second.address == p.address &&
        it->second.dial_out_only == p.dial_out_only && it->second.public_key == p.public_key &&
        it->second.relay == p.relay)
      continue;
    const std::string endpoint = transportEndpointOf(p);
    if (it == peers_.end()) {
      // A name node.json did not have: a ring member of a new cluster (docs/OPERATIONS.md
      // "Growing"). Added to the transport now, so the rings can welcome it.
      transport_.addPeer(name, endpoint, p.public_key);
      moved.push_back(name + " at " + whereIs(p) + " (new)");
      continue;
    }
    // Only the relay changed (its relay was lost, coordinator/VolunteerRelays.h): the same
    // process at the other end, reached another way; the link loses nothing (RelayedLinks.h).
    const bool same_holder = it->second.address == p.address && it->second.public_key == p.public_key &&
                             it->second.dial_out_only == p.dial_out_only;
    // A peer the transport has not added (yet) is left alone: repointPeer says false.
    if (transport_.repointPeer(name, endpoint, p.public_key)) {
      moved.push_back(name + " at " + whereIs(p) + (same_holder ? " (another relay)" : ""));
      if (repointed && !same_holder) repointed->push_back(name);
    }
  }
  if (zap_) {
    std::map<std::string, std::string> admitted;
    for (const auto& [name, p] : next) admitted.emplace(p.public_key, name);
    zap_->setAllowed(std::move(admitted));
  }
  peers_ = next;
  return moved;
}

}  // namespace cairn
