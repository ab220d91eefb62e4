#include "coordinator/Admissions.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>

#include "clusterize/NodeDataWriter.h"
#include "coordinator/JoinPolicy.h"
#include "coordinator/Replacement.h"
#include "coordinator/RunView.h"
#include "core/Error.h"
#include "core/Log.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"
#include "core/TorchCompat.h"
#include "node/transport/Relay.h"

namespace cairn::coordinator {

// A join waiting for the coordinator's dial-back to the volunteer's advertised address.
struct Admissions::Pending {
  std::string key, routing_id, nonce;
  std::string seen_from;  // the address its connection to the coordinator came from
  // The dial-back to its port + 1 too, where dial-out-only peers will connect
  // (docs/PROTOCOL.md "Reversed links"): reachable only when both answered.
  zmq::socket_t accept_socket;
  bool answered = false, accept_answered = false;
  JoinAsk ask;
  JoinDecision decision;
  zmq::socket_t socket;
  std::chrono::steady_clock::time_point deadline;
};

Admissions::Admissions(CoordinatorStore& store, zmq::context_t& context, const CurveKeyPair& keys,
                       AdmissionOptions options, SendRouted send_routed, Send send, Refuse refuse)
    : store_(store),
      context_(context),
      keys_(keys),
      o_(std::move(options)),
      send_routed_(std::move(send_routed)),
      send_(std::move(send)),
      refuse_(std::move(refuse)) {}

Admissions::~Admissions() = default;

void Admissions::onJoin(const Routed& r, const JoinAsk& ask, bool run_over) {
  const std::string who = ask.advertise.empty() ? "key " + r.user_id : ask.advertise;
  if (run_over) return refuse_(r.routing_id, who, "this run is over");
  for (const auto& p : pending_)
    if (p->key == r.user_id)
      return refuse_(r.routing_id, who, "a join from this key is already being checked");
  JoinDecision decision = decideJoin(ask, r.user_id, o_.token, o_.allowed_keys, store_.members(),
                                     stageFilesLibtorch());
  if (decision.kind == JoinDecision::Kind::kRefused)
    return refuse_(r.routing_id, who, decision.reason);
  auto p = std::make_unique<Pending>();
  p->key = r.user_id;
  p->routing_id = r.routing_id;
  p->seen_from = r.peer_address;
  p->nonce = randomHex(16);
  p->ask = ask;
  p->decision = std::move(decision);
  // No address: dial-out only at once (docs/OPERATIONS.md "Behind a home router").
  if (ask.advertise.empty()) return admit(*p, /*reachable=*/false);
  if (ask.relay_mbps) {  // a relay: its relay must answer an attach at the advertised address
    p->deadline = std::chrono::steady_clock::now() + o_.reach_timeout;
    p->socket = coordinationClient(context_, zmq::socket_type::dealer, keys_, r.user_id,
                                   ask.advertise, 1 << 16);
    sendFrames(p->socket, {kRelayAttach, kRelayCoordinatorMember});
    pending_.push_back(std::move(p));
    return;
  }
  // Dial the advertised address back before accepting it as reachable: peers will dial it.
  p->deadline = std::chrono::steady_clock::now() + o_.reach_timeout;
  p->socket = coordinationClient(context_, zmq::socket_type::dealer, keys_, r.user_id,
                                 ask.advertise, kMaxCoordinationHeaderBytes);
  sendFrames(p->socket, encode(ReachCheck{p->nonce}));
  p->accept_socket = coordinationClient(context_, zmq::socket_type::dealer, keys_, r.user_id,
                                        acceptAddressOf(ask.advertise), kMaxCoordinationHeaderBytes);
  sendFrames(p->accept_socket, encode(ReachCheck{p->nonce}));
  pending_.push_back(std::move(p));
}

// host:PORT+1 of an advertised host:PORT (JoinPolicy checked its shape).
std::string Admissions::acceptAddressOf(const std::string& advertise) {
  const size_t colon = advertise.rfind(':');
  return advertise.substr(0, colon + 1) + std::to_string(std::stoi(advertise.substr(colon + 1)) + 1);
}

// Whether `socket` got `reach_ok` with the pending join's nonce (reads what is queued).
bool Admissions::answeredOn(zmq::socket_t& socket, const std::string& nonce) {
  while (auto frames = recvFrames(socket, std::chrono::milliseconds(0))) {
    std::string why;
    const auto m = decodeReach(*frames, &why);
    const auto* ok = m ? std::get_if<ReachOk>(&*m) : nullptr;
    if (ok && ok->nonce == nonce) return true;
  }
  return false;
}

// Whether a relay's ROUTER answered the coordinator's attach with a presence (node/transport/Relay.h).
bool Admissions::relayAnswered(zmq::socket_t& socket) {
  while (auto frames = recvFrames(socket, std::chrono::milliseconds(0)))
    if (!frames->empty() && (*frames)[0] == kRelayPresence) return true;
  return false;
}

void Admissions::poll() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = *pending_[i];
    if (p.ask.relay_mbps) {
      const bool answered = relayAnswered(p.socket);
      if (answered) admit(p, /*reachable=*/true);
      if (!answered && std::chrono::steady_clock::now() >= p.deadline) refuseRelay(p);
      if (answered || std::chrono::steady_clock::now() >= p.deadline) {
        pending_.erase(pending_.begin() + long(i));
      } else {
        ++i;
      }
      continue;
    }
    bool done = false;
    p.answered = p.answered || answeredOn(p.socket, p.nonce);
    p.accept_answered = p.accept_answered || answeredOn(p.accept_socket, p.nonce);
    if (p.answered && p.accept_answered) {
      admit(p, /*reachable=*/true);
      done = true;
    }
    if (!done && std::chrono::steady_clock::now() >= p.deadline) {
      // Not refused: it trains as a dial-out-only volunteer, dialling its (reachable) peers.
      admit(p, /*reachable=*/false);
      done = true;
    }
    if (done) {
      pending_.erase(pending_.begin() + long(i));
    } else {
      ++i;
    }
  }
}

// Whether the plan placed node `name` dial-out only (its node.json in the coordinator's folder);
// false when there is no such node.json (no node, or not planned yet).
bool Admissions::placedDialOutOnly(const std::string& name) const {
  const std::string path = nodeSpecPath(o_.out, name);
  if (!std::ifstream(path).good()) return false;
  return readNodeSpec(path).dial_out_only;
}

// A volunteer back after it said it leaves or was lost (JoinDecision::kRejoining): its node again when nobody
// took it over (then it must be where its neighbours will dial it), else a spare; a row that kept
// its old node's name for the record (<node>-lost-<n>) gets a fresh name.
std::optional<std::string> Admissions::rejoin(Member& m, const std::string& advertise) {
  const auto placed = nlohmann::json::parse(store_.meta("placed").value_or("[]"), nullptr, false);
  const bool holds_node = placed.is_array() && std::find(placed.begin(), placed.end(), m.name) != placed.end();
  if (holds_node && store_.meta("phase").value_or("gathering") == "planned") {
    if (!placedDialOutOnly(m.name) && advertise != m.advertise)
      return m.name + " left and waits for a holder at " + m.advertise + "; join with --advertise " +
             m.advertise + " to take it again, or once a spare has taken it over";
    m.state = MemberState::kAssigned;
    return std::nullopt;
  }
  if (isLostRowName(m.name)) {
    const std::string fresh = store_.nextMemberName();
    store_.renameMember(m.name, fresh);
    m.name = fresh;
  }
  m.state = MemberState::kSpare;
  return std::nullopt;
}

// A relay that did not answer at its advertised address: nobody could use it.
void Admissions::refuseRelay(const Pending& p) {
  const std::string port = p.ask.advertise.substr(p.ask.advertise.rfind(':') + 1);
  refuse_(p.routing_id, p.ask.advertise,
          "the relay at " + p.ask.advertise + " did not answer the coordinator within " +
              std::to_string(o_.reach_timeout.count() / 1000.0).substr(0, 4) +
              " s, and a relay must be reachable (both ends of its links dial it): forward TCP port " +
              port + " of " + (p.seen_from.empty() ? "its public address" : hostForPort(p.seen_from)) +
              " to this machine, or advertise an address that reaches it");
}

// The line a dial-out-only volunteer prints: why, and what would make it reachable.
std::string Admissions::reachabilityLine(const Pending& p) const {
  const std::string seen = p.seen_from.empty() ? "an address it could not tell" : p.seen_from;
  const std::string host = p.seen_from.empty() ? "HOST" : hostForPort(p.seen_from);
  // The port it gave, else the one the docs use (any free port will do).
  const int port = p.ask.advertise.empty() ? 7100 : std::stoi(p.ask.advertise.substr(p.ask.advertise.rfind(':') + 1));
  const std::string within =
      " within " + std::to_string(o_.reach_timeout.count() / 1000.0).substr(0, 4) + " s";
  const std::string why =
      p.ask.advertise.empty() ? "no address given (no --listen)"
      : !p.answered ? "the advertised address " + p.ask.advertise +
                          " did not answer the coordinator's dial-back" + within
                    : "the advertised address " + p.ask.advertise + " answered but " +
                          acceptAddressOf(p.ask.advertise) +
                          " (where volunteers behind routers connect) did not" + within;
  return "dial-out only: " + why + "; this volunteer trains over connections it opens itself, "
         "next to reachable volunteers. The coordinator saw it come from " + seen +
         ". To be reachable: forward TCP ports " + std::to_string(port) + " and " +
         std::to_string(port + 1) + " of " + host + " to this machine and join with --listen 0.0.0.0:" +
         std::to_string(port) + " --advertise " + host + ":" + std::to_string(port);
}

void Admissions::admit(const Pending& p, bool reachable) {
  Member m;
  const bool returning = p.decision.kind != JoinDecision::Kind::kNew;
  const bool relay = p.ask.relay_mbps.has_value();
  if (returning) {
    m = *p.decision.member;
    if (relay) {
      m.state = MemberState::kRelaying;  // a relay back (restarted, or lost and back)
    } else if (p.decision.kind == JoinDecision::Kind::kRejoining) {
      if (const auto why = rejoin(m, p.ask.advertise)) return refuse_(p.routing_id, p.ask.advertise, *why);
    }
    // Its placed node's peers dial it, or wait for it to dial them: that cannot change under them.
    if (m.state == MemberState::kAssigned) {
      if (const auto why = holderCannotComeBack(m, reachable, placedDialOutOnly(m.name)))
        return refuse_(p.routing_id, p.ask.advertise, *why);
    }
  } else {
    m.name = store_.nextMemberName();
    m.public_key = p.key;
    m.state = relay ? MemberState::kRelaying : MemberState::kSpare;
    m.joined_at = unixNow();
  }
  m.advertise = reachable ? p.ask.advertise : "";
  m.dial_out_only = !reachable;
  m.probe_json = encodeVolunteerProbe(p.ask.probe).dump();
  m.last_seen = unixNow();
  store_.putMember(m);
  CAIRN_INFO("coordinator: ", returning ? "back: " : "joined: ", m.name, " at ",
             reachable ? m.advertise : "(dial-out only, from " + p.seen_from + ")", " (",
             p.ask.probe.ram_gb, " GB, ", p.ask.probe.cores, " cores, ", p.ask.probe.compute_gflops,
             " GFLOPS, ", p.ask.probe.bandwidth_mbps, " Mbps, GPUs: ", describeGpus(p.ask.probe.gpus),
             ", libtorch ", p.ask.probe.libtorch, "), ", toString(m.state),
             relay ? (*p.ask.relay_mbps > 0 ? " (at most " + std::to_string(int64_t(*p.ask.relay_mbps)) +
                                                   " Mbit/s)"
                                             : std::string(" (no cap)"))
                   : std::string());
  const std::string note =
      m.state == MemberState::kSpare && o_.spare_note ? o_.spare_note(m) : std::string();
  if (!note.empty()) CAIRN_INFO("coordinator: told ", m.name, ": ", note);
  const std::string reach = reachable ? std::string() : reachabilityLine(p);
  if (!reach.empty()) CAIRN_INFO("coordinator: told ", m.name, ": ", reach);
  send_routed_(p.routing_id, encode(Accepted{m.name, toString(m.state), note, reach}));
  if (m.state == MemberState::kAssigned) resendAssignment(m);
}

// The libtorch that wrote the stage files this coordinator sends: the plan's once it has planned
// (a restarted coordinator may be another build), before that its own (it will write them).
std::string Admissions::stageFilesLibtorch() const {
  if (store_.meta("phase").value_or("gathering") != "gathering") {
    try {
      if (auto recorded = clusterize::NodeDataWriter::stageFilesLibtorch(o_.out)) return *recorded;
    } catch (const Error& e) {
      CAIRN_WARN("coordinator: ", e.what(), "; comparing joining volunteers with this build's libtorch");
    }
  }
  return libtorchVersion();
}

// A placed volunteer that joined again (its process restarted) gets its assignment again.
void Admissions::resendAssignment(const Member& m) {
  const NodeSpec node = readNodeSpec(nodeSpecPath(o_.out, m.name));
  const JobSpec job = readJobSpec(jobSpecPath(o_.out));
  Assignment a;
  a.name = m.name;
  a.node = toJson(node);
  a.job = toJson(job);
  a.num_clusters = node.extra.value("num_clusters", 1);
  std::ifstream in(nodeDirectory(o_.out, m.name) + "/" + node.stage_file, std::ios::binary);
  a.stage.assign(std::istreambuf_iterator<char>(in), {});
  send_(m.public_key, encode(a));
}

}  // namespace cairn::coordinator
