// LivePeers: a running node's peers changed under it (a ring peer in another cluster was lost
// and a spare took its node over: docs/OPERATIONS.md "A lost volunteer is replaced by a spare").
// apply(updated node.json) re-points every peer whose address or CURVE key differs
// (ZmqTransport::repointPeer, under that peer's send lock like every send) and makes the ZAP
// authenticator admit exactly the updated peers' keys (ZapAuthenticator::setAllowed), so the
// replacement's ring join gets in and the answers reach its new address. The rings address
// peers by name only, so nothing else changes. A peer whose name node.json did not have (a ring
// member of a new cluster: docs/OPERATIONS.md "Growing") is added to the transport
// (ZmqTransport::addPeer with its key); RingClusterSync::addMembers then takes it into the rings.
// Ownership: borrows the transport and the authenticator (null without CURVE); both must
// outlive it. Thread-safety: apply() from any thread (own mutex); the transport's own locks do
// the rest.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/NodeData.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/ZmqTransport.h"

namespace cairn {

class LivePeers {
 public:
  LivePeers(ZmqTransport& transport, ZapAuthenticator* zap, const NodeSpec& node);
  // Returns "name at host:port" for each peer re-pointed ("… (new)" for each peer added), and the
  // names of those re-pointed to another process (another address or key: a replacement) in
  // `*repointed` when given; a peer only reached through another relay is re-pointed and not
  // named there (the same process: its rings need not wait for it to rejoin). BadInput when `updated` is another node
  // or names a peer without a key while CURVE is on.
  std::vector<std::string> apply(const NodeSpec& updated, std::vector<std::string>* repointed = nullptr);

 private:
  ZmqTransport& transport_;
  ZapAuthenticator* zap_;
  std::string name_;
  std::mutex mutex_;
  std::map<std::string, PeerRef> peers_;  // under mutex_: name → what the transport dials now
};

// The endpoint the transport is given for a peer: tcp://ADDRESS, kDialsUsEndpoint for a
// dial-out-only peer (node/transport/ReversedLinks.h), a relayed endpoint for one reached through
// a relay (node/transport/RelayedLinks.h).
std::string transportEndpointOf(const PeerRef& peer);
// Where a peer is, for log lines: its address, "(dial-out only)", or its relay.
std::string whereIs(const PeerRef& peer);
// Every peer a node.json names (upstream, downstream, ring members; not the node itself).
std::map<std::string, PeerRef> peersOf(const NodeSpec& node);

}  // namespace cairn
