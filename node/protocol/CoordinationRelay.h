// CoordinationRelay: the relay volunteers' parts of the coordination messages (Coordination.h):
// the join's `relay` offer, the heartbeat's `relay` figures and `relay_links`. Coordination.cpp's
// encoders and decoders call these; nothing else does.
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "node/protocol/Coordination.h"
#include "node/protocol/CoordinationFields.h"

namespace cairn::coordination_detail {

nlohmann::json encodeRelayFigures(const RelayFigures& f);
nlohmann::json encodeRelayLinks(const RelayLinksUpdate& m);  // the header, without "protocol"
// The join's "relay" (absent: nullopt with `in` still ok): {"mbps": number in [0, kMaxRelayMbps]}.
std::optional<double> decodeRelayOffer(const nlohmann::json& h, Fields& in);
// The heartbeat's "relay" (absent: nullopt): four non-negative integers.
std::optional<RelayFigures> decodeRelayFigures(const nlohmann::json& h, Fields& in);
// relay_links: a member name of at most kMaxNodeNameBytes, each key a Z85 public key, at most
// kMaxRelayMembers members, each link two different member names.
std::optional<RelayLinksUpdate> decodeRelayLinks(const nlohmann::json& h, Fields& in);

}  // namespace cairn::coordination_detail
