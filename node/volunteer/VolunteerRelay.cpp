#include "node/volunteer/VolunteerRelay.h"

#include <cstdlib>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/Relay.h"
#include "node/volunteer/VolunteerRun.h"
#include "node/volunteer/VolunteerSockets.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;

RelayFigures figuresOf(const RelayStats& s) {
  RelayFigures f;
  f.messages = int64_t(s.messages_forwarded);
  f.bytes = int64_t(s.bytes_forwarded);
  f.waiting = int64_t(s.bytes_waiting);
  f.refused = int64_t(s.refused_unplanned + s.refused_over_budget + s.dropped_waiting +
                      s.forged_attaches + s.malformed + s.revoked + s.refused_keys);
  return f;
}

// CAIRN_TEST_RELAY_TAMPER=SEED (tests only): the relay tampers with what it forwards.
uint64_t tamperSeed() {
  const char* seed = std::getenv("CAIRN_TEST_RELAY_TAMPER");
  if (!seed || !*seed) return 0;
  const uint64_t value = std::strtoull(seed, nullptr, 10);
  CAIRN_WARN("CAIRN_TEST_RELAY_TAMPER=", value, ": this relay drops, flips, doubles and reorders "
             "messages (a test of the links' end-to-end seal)");
  return value;
}

}  // namespace

bool VolunteerSession::serveAsRelay(const std::function<void(const RelayLinksUpdate&)>& on_links,
                                    const std::function<RelayFigures()>& figures) {
  CAIRN_ENFORCE(!name_.empty(), "serveAsRelay before join");
  zmq::socket_t& socket = mainSocket();
  auto next_beat = Clock::now();
  for (;;) {
    if (stopRequested()) {
      sendLeaving("stopped");
      return false;
    }
    if (Clock::now() >= next_beat) {
      (void)trySendFrames(socket, encode(Heartbeat{name_, "relaying", -1, figures()}));
      next_beat = Clock::now() + config_.heartbeat_interval;
    }
    auto message = receive(next_beat);
    if (!message) continue;
    if (auto* links = std::get_if<RelayLinksUpdate>(&*message)) {
      if (links->name == name_) {
        on_links(*links);
      } else {
        CAIRN_WARN(coordinator_, " sent relay_links for ", links->name, ", not for this relay (",
                   name_, "): ignored");
      }
    } else if (auto* f = std::get_if<Finished>(&*message)) {
      CAIRN_INFO("the coordinator says the run is over (", f->reason, ")");
      return true;
    } else if (auto* r = std::get_if<Rejected>(&*message)) {
      refused(r->reason);
    } else {
      CAIRN_DEBUG("ignored a message from the coordinator while relaying");
    }
  }
}

int runRelayVolunteer(const VolunteerConfig& config) {
  setLogTag("relay");
  CAIRN_ENFORCE(config.relay_mbps.has_value(), "runRelayVolunteer without relay_mbps");
  VolunteerSession session(config);
  RelayOptions o;
  std::string listen = config.listen;
  if (listen.size() > 2 && listen.compare(listen.size() - 2, 2, ":0") == 0)
    listen = listen.substr(0, listen.size() - 1) + "*";
  o.bind_endpoint = "tcp://" + listen;
  o.own = session.workdir().loadOrCreateIdentity();
  o.max_message_bytes = int64_t(config.max_message_bytes);
  o.max_mbps = *config.relay_mbps;
  o.test_tamper_seed = tamperSeed();
  Relay relay(o);
  const std::map<std::string, std::string> coordinator{{kRelayCoordinatorMember, config.invite.coordinator_key}};
  relay.setLinks(coordinator, {});  // the coordinator's check of this address
  const std::string bound = relay.boundEndpoint();
  session.relayBound(bound.substr(bound.find("://") + 3));
  const auto accepted = session.join(probeThisMachine(config));
  if (!accepted) {
    CAIRN_INFO("stopped before the coordinator answered");
    return 0;
  }
  setLogTag(session.name());
  if (accepted->state != "relaying")
    CAIRN_THROW(BadInput, "the coordinator at ", config.invite.address(), " took this relay as \"",
                accepted->state, "\", not \"relaying\" (a coordinator without volunteer relays?)");
  CAIRN_INFO("relaying for the run at ", session.advertised(),
             *config.relay_mbps > 0 ? " (at most " + std::to_string(*config.relay_mbps) + " Mbit/s)"
                                    : std::string(" (no cap)"));
  size_t links_now = 0;
  const bool finished = session.serveAsRelay(
      [&](const RelayLinksUpdate& update) {
        std::map<std::string, std::string> members = update.members;
        members.insert(coordinator.begin(), coordinator.end());
        if (update.links.size() != links_now)
          CAIRN_INFO("relaying ", update.links.size(), " link(s) of ", update.members.size(),
                     " volunteer(s)");
        links_now = update.links.size();
        relay.setLinks(std::move(members), update.links);
      },
      [&relay] { return figuresOf(relay.stats()); });
  const RelayStats s = relay.stats();
  CAIRN_INFO(finished ? "done" : "stopped", ": forwarded ", s.messages_forwarded, " messages, ",
             s.bytes_forwarded, " bytes", s.tampered ? ", tampered with " + std::to_string(s.tampered) : "");
  return 0;
}

}  // namespace cairn
