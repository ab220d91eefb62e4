#include "node/protocol/CoordinationRelay.h"

#include <cmath>

#include "core/CurveKeys.h"

namespace cairn::coordination_detail {

nlohmann::json encodeRelayFigures(const RelayFigures& f) {
  return {{"messages", f.messages}, {"bytes", f.bytes}, {"waiting", f.waiting}, {"refused", f.refused}};
}

nlohmann::json encodeRelayLinks(const RelayLinksUpdate& m) {
  nlohmann::json links = nlohmann::json::array();
  for (const auto& [a, b] : m.links) links.push_back({a, b});
  return {{"type", "relay_links"}, {"name", m.name}, {"members", m.members}, {"links", links}};
}

std::optional<double> decodeRelayOffer(const nlohmann::json& h, Fields& in) {
  if (!in.ok() || !h.contains("relay")) return std::nullopt;
  const nlohmann::json offer = in.object("relay");
  if (!in.ok()) return std::nullopt;
  Fields inner(offer, "join: relay", nullptr);
  const double mbps = inner.number("mbps");
  if (!inner.ok() || mbps < 0 || mbps > kMaxRelayMbps) {
    in.fail("relay", "{\"mbps\": a number in [0, " + std::to_string(int64_t(kMaxRelayMbps)) + "]}");
    return std::nullopt;
  }
  return mbps;
}

std::optional<RelayFigures> decodeRelayFigures(const nlohmann::json& h, Fields& in) {
  if (!in.ok() || !h.contains("relay")) return std::nullopt;
  const nlohmann::json figures = in.object("relay");
  if (!in.ok()) return std::nullopt;
  Fields inner(figures, "heartbeat: relay", nullptr);
  RelayFigures f;
  f.messages = inner.integer("messages", 0, INT64_MAX);
  f.bytes = inner.integer("bytes", 0, INT64_MAX);
  f.waiting = inner.integer("waiting", 0, INT64_MAX);
  f.refused = inner.integer("refused", 0, INT64_MAX);
  if (!inner.ok()) {
    in.fail("relay", "{\"messages\", \"bytes\", \"waiting\", \"refused\"}: non-negative integers");
    return std::nullopt;
  }
  return f;
}

std::optional<RelayLinksUpdate> decodeRelayLinks(const nlohmann::json& h, Fields& in) {
  RelayLinksUpdate m;
  m.name = in.string("name", kMaxNodeNameBytes);
  const nlohmann::json members = in.object("members");
  if (!in.ok()) return std::nullopt;
  if (members.size() > kMaxRelayMembers) {
    in.fail("members", "at most " + std::to_string(kMaxRelayMembers) + " members");
    return std::nullopt;
  }
  for (const auto& [name, key] : members.items()) {
    if (name.empty() || name.size() > kMaxNodeNameBytes || !key.is_string() ||
        !isZ85Key(key.get<std::string>())) {
      in.fail("members", "names of 1 to " + std::to_string(kMaxNodeNameBytes) +
                             " bytes, each to a Z85 public key (40 characters)");
      return std::nullopt;
    }
    m.members[name] = key.get<std::string>();
  }
  auto links = h.find("links");
  if (links == h.end() || !links->is_array() || links->size() > kMaxRelayMembers * 4) {
    in.fail("links", "an array of at most " + std::to_string(kMaxRelayMembers * 4) + " pairs");
    return std::nullopt;
  }
  for (const nlohmann::json& pair : *links) {
    const bool two = pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_string();
    const std::string a = two ? pair[0].get<std::string>() : "", b = two ? pair[1].get<std::string>() : "";
    if (!two || a == b || !m.members.count(a) || !m.members.count(b)) {
      in.fail("links", "pairs of two different member names");
      return std::nullopt;
    }
    m.links.insert(std::minmax(a, b));
  }
  return m;
}

}  // namespace cairn::coordination_detail
