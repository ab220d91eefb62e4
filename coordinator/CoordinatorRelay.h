// CoordinatorRelay: the coordinator's own relay (`clusterize --serve … --relay HOST:PORT`;
// docs/OPERATIONS.md "Behind a home router"), for links between two dial-out-only volunteers when
// the researcher asks for it: a link through it puts the coordinator on that link's hot path, and
// the link pauses while the coordinator restarts. The relay itself is node/transport/Relay.h (its
// own thread and ZeroMQ context, the coordinator's CURVE keys); this keeps what it admits and
// forwards equal to the plan: sync() reads the placed nodes' node.json (as planned, as a
// replacement rewrote them) and gives the relay the members and links named "coordinator".
// Ownership: owns the Relay. Thread-safety: the coordinator's loop thread (the Relay has its own).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/DialOutPlacement.h"
#include "core/CurveKeys.h"
#include "core/NodeData.h"
#include "node/transport/Relay.h"

namespace cairn::coordinator {

// The name node.json gives the coordinator's relay.
inline constexpr char kCoordinatorRelayName[] = "coordinator";

class CoordinatorRelay {
 public:
  // Binds `listen` (host:port); `advertise` (host:port, empty: listen, which must then not be a
  // wildcard) is what volunteers dial. BadInput naming the flag when either is unusable.
  CoordinatorRelay(const std::string& listen, const std::string& advertise, const CurveKeyPair& keys,
                   int64_t max_message_bytes);
  // What node.json says of this relay: {"coordinator", advertised address, the coordinator's key}.
  const PeerRef::Relay& ref() const { return ref_; }
  // Gives the relay the links of the placed nodes' node.json (`out`/nodes/…); nothing when they
  // did not change. Cheap to call when nothing is relayed.
  void sync(const std::string& out, const std::vector<std::string>& placed);
  RelayStats stats() const { return relay_->stats(); }
  // The live view's "relay" (RunView.h): forwarded in all and per link, refused by reason.
  nlohmann::json figures() const;

 private:
  std::unique_ptr<Relay> relay_;
  PeerRef::Relay ref_;
  RelayLinks current_;
};

}  // namespace cairn::coordinator
