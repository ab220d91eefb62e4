#include "coordinator/CoordinatorRelay.h"

#include "core/Error.h"
#include "core/Log.h"
#include "core/NodeConfigs.h"

namespace cairn::coordinator {

CoordinatorRelay::CoordinatorRelay(const std::string& listen, const std::string& advertise,
                                   const CurveKeyPair& keys, int64_t max_message_bytes) {
  std::string host;
  int port = 0;
  parseHostPort(listen, "command line", "--relay", &host, &port);
  std::string dialled = advertise.empty() ? listen : advertise;
  if (advertise.empty() && isWildcardHost(host))
    CAIRN_THROW(BadInput, "--relay ", listen, " binds every interface, which volunteers cannot dial: "
                "give --relay-advertise HOST:PORT, the address they dial");
  parseHostPort(dialled, "command line", advertise.empty() ? "--relay" : "--relay-advertise", &host,
                &port);
  RelayOptions o;
  o.bind_endpoint = "tcp://" + listen;
  o.own = keys;
  o.max_message_bytes = max_message_bytes;
  relay_ = std::make_unique<Relay>(o);
  ref_ = {kCoordinatorRelayName, dialled, keys.public_key};
  CAIRN_INFO("coordinator: relaying links between dial-out-only volunteers on ",
             relay_->boundEndpoint(), " (dialled at ", dialled, ")");
}

void CoordinatorRelay::sync(const std::string& out, const std::vector<std::string>& placed) {
  std::vector<NodeSpec> nodes;
  nodes.reserve(placed.size());
  for (const std::string& name : placed) nodes.push_back(readNodeSpec(nodeSpecPath(out, name)));
  RelayLinks links = relayLinksOf(nodes, kCoordinatorRelayName);
  if (links.members == current_.members && links.pairs == current_.pairs) return;
  relay_->setLinks(links.members, links.pairs);
  CAIRN_INFO("coordinator: the relay forwards ", links.pairs.size(), " link(s) of ",
             links.members.size(), " volunteer(s)");
  current_ = std::move(links);
}

nlohmann::json CoordinatorRelay::figures() const {
  const RelayStats s = relay_->stats();
  nlohmann::json links = nlohmann::json::array();
  for (const auto& [link, bytes] : s.bytes_per_link)
    links.push_back({{"from", link.first}, {"to", link.second}, {"bytes", bytes}});
  return {{"messages_forwarded", s.messages_forwarded},
          {"bytes_forwarded", s.bytes_forwarded},
          {"bytes_waiting", s.bytes_waiting},
          {"links", links},
          {"refused",
           {{"unplanned", s.refused_unplanned},
            {"over_budget", s.refused_over_budget},
            {"dropped_waiting", s.dropped_waiting},
            {"forged_attach", s.forged_attaches},
            {"malformed", s.malformed},
            {"revoked", s.revoked},
            {"refused_key", s.refused_keys}}}};
}

}  // namespace cairn::coordinator
