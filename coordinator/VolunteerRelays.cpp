#include "coordinator/VolunteerRelays.h"

#include <algorithm>

#include "core/CurveKeys.h"
#include "core/JsonReader.h"
#include "core/Log.h"

namespace cairn::coordinator {
namespace {

constexpr double kRetellRelayAfterS = 5;

std::string joinedNames(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// linksView(): every link of `nodes` by how it is made.
nlohmann::json describeLinks(const std::vector<NodeSpec>& nodes) {
  std::map<std::pair<std::string, std::string>, std::string> via;
  std::map<std::string, bool> dial_out_only;
  for (const NodeSpec& n : nodes) dial_out_only[n.name] = n.dial_out_only;
  auto note = [&](const NodeSpec& n, const PeerRef& ref) {
    if (ref.name == n.name) return;
    const auto link = std::minmax(n.name, ref.name);
    if (ref.relay) via[link] = ref.relay->name;
    else if (!via.count(link)) via[link] = n.dial_out_only || ref.dial_out_only ? "dial-out" : "direct";
  };
  for (const NodeSpec& n : nodes) {
    if (n.upstream) note(n, *n.upstream);
    if (n.downstream) note(n, *n.downstream);
    for (const RingSpec& ring : n.rings)
      for (const PeerRef& m : ring.members) note(n, m);
  }
  int64_t direct = 0, dial_out = 0, relayed = 0;
  nlohmann::json listed = nlohmann::json::array();
  for (const auto& [link, how] : via) {
    if (how == "direct") {
      ++direct;
      continue;
    }
    ++(how == "dial-out" ? dial_out : relayed);
    listed.push_back({{"a", link.first}, {"b", link.second}, {"via", how}});
  }
  return {{"direct", direct}, {"dial_out", dial_out}, {"relayed", relayed}, {"not_direct", listed}};
}

}  // namespace

VolunteerRelays::VolunteerRelays(CoordinatorStore& store, std::string out, double lost_after_s,
                                 double started_at, std::optional<PeerRef::Relay> coordinator_relay,
                                 Send send)
    : store_(store),
      out_(std::move(out)),
      lost_after_s_(lost_after_s),
      started_at_(started_at),
      coordinator_relay_(std::move(coordinator_relay)),
      send_(std::move(send)) {}

bool VolunteerRelays::alive(const Member& m, double now) const {
  // Silence counts from this coordinator's start at the earliest (a restarted one heard nobody);
  // the same rule as for spares (Replacement.h heardLately).
  return m.state == MemberState::kRelaying && heardLately(m, now, started_at_, lost_after_s_, gone_);
}

std::vector<PeerRef::Relay> VolunteerRelays::liveRelays(double now) const {
  std::vector<PeerRef::Relay> out;
  for (const Member& m : store_.members())
    if (alive(m, now)) out.push_back({m.name, m.advertise, m.public_key});
  return out;
}

std::vector<PeerRef::Relay> VolunteerRelays::forPlanning(double now) const {
  std::vector<PeerRef::Relay> live = liveRelays(now);
  if (live.empty() && coordinator_relay_) live.push_back(*coordinator_relay_);
  return live;
}

std::vector<NodeSpec> VolunteerRelays::placedNodes() const {
  std::vector<NodeSpec> nodes;
  for (const std::string& name : store_.placedNames()) nodes.push_back(readNodeSpec(nodeSpecPath(out_, name)));
  return nodes;
}

void VolunteerRelays::onHeartbeat(const Member& member, const Heartbeat& beat, double now) {
  if (member.state != MemberState::kRelaying) return;
  if (beat.relay) figures_[member.name] = *beat.relay;
  const RelayLinks& want = links_[member.name];
  Told& told = told_[member.name];
  if (told.at > 0 && told.links.members == want.members && told.links.pairs == want.pairs &&
      now - told.at < kRetellRelayAfterS)
    return;
  RelayLinksUpdate update{member.name, {}, want.pairs};
  for (const auto& [name, key] : want.members)
    if (isZ85Key(key)) update.members[name] = key;  // node.json always has them in a served run
  for (auto it = update.links.begin(); it != update.links.end();)
    it = update.members.count(it->first) && update.members.count(it->second) ? std::next(it)
                                                                             : update.links.erase(it);
  send_(member.public_key, encode(update));
  told = {want, now};
}

std::set<std::string> VolunteerRelays::poll(double now) {
  std::set<std::string> alive_now;
  std::vector<Member> relays;
  for (const Member& m : store_.members()) {
    if (m.state != MemberState::kRelaying) continue;
    relays.push_back(m);
    if (alive(m, now)) alive_now.insert(m.name);
  }
  if (coordinator_relay_) alive_now.insert(coordinator_relay_->name);
  for (const Member& m : relays) {
    if (alive_.count(m.name) && !alive_now.count(m.name)) {
      if (const std::optional<double> gone_for = gone_.goneFor(m, now))
        CAIRN_WARN("coordinator: the relay ", m.name, " at ", m.advertise, ": its connections to the "
                   "coordinator closed ", *gone_for, " s ago (--gone-after-s ", gone_.gone_after_s,
                   "): lost; its links move to another relay");
      else
        CAIRN_WARN("coordinator: the relay ", m.name, " at ", m.advertise, " is silent for over ",
                   lost_after_s_, " s: lost; its links move to another relay");
    }
    if (!alive_.count(m.name) && alive_now.count(m.name) && links_version_ != ~uint64_t{0})
      CAIRN_INFO("coordinator: the relay ", m.name, " at ", m.advertise, " is heard again");
  }
  const bool moved = alive_now != alive_;
  alive_ = alive_now;
  if (store_.meta("phase").value_or("gathering") != "planned") return {};
  if (!moved && store_.membersVersion() == links_version_) return {};
  links_version_ = store_.membersVersion();
  // The placed nodes' files are read only when who holds them changed (a plan, a replacement, a
  // growth) or a relay was lost or came: a spare joining a run of 1,000 changes neither.
  std::string holders = store_.meta("placed").value_or("[]");
  const std::vector<std::string> placed = store_.placedNames();
  const std::set<std::string> placed_set(placed.begin(), placed.end());
  for (const Member& m : store_.members())
    if (placed_set.count(m.name)) holders += m.name + ":" + m.public_key + ";";
  if (!moved && holders == holders_) return {};
  holders_ = std::move(holders);
  std::vector<NodeSpec> nodes = placedNodes();
  const std::vector<PeerRef::Relay> targets = forPlanning(now);
  const std::set<std::string> changed = reassignRelays(nodes, alive_, targets);
  for (const NodeSpec& n : nodes)
    if (changed.count(n.name)) writeJsonFile(nodeSpecPath(out_, n.name), toJson(n));
  if (!changed.empty())
    CAIRN_INFO("coordinator: links of ", joinedNames(changed), " moved to ",
               targets.size() == 1 ? "the relay " + targets[0].name : "the least loaded relays",
               " (their relay was lost); they are told");
  links_.clear();
  for (const Member& m : relays) links_[m.name] = relayLinksOf(nodes, m.name);
  links_view_ = describeLinks(nodes);
  ++links_view_version_;
  // Each relay hears its links now, not at its next heartbeat (its links changed, or it is new).
  for (const Member& m : relays)
    if (alive_.count(m.name)) onHeartbeat(m, Heartbeat{m.name, "relaying", -1}, now);
  // A link whose relay is lost and no relay to move it to: it waits (logged once per change).
  if (targets.empty()) {
    std::set<std::string> dangling;
    for (const auto& [relay, links] : links_)
      if (!alive_.count(relay) && !links.pairs.empty()) dangling.insert(relay);
    if (!dangling.empty())
      CAIRN_WARN("coordinator: the links through ", joinedNames(dangling),
                 " wait: no relay is alive to take them (a volunteer's provider --join … --relay, "
                 "or the coordinator's --relay)");
  }
  return changed;
}

nlohmann::json VolunteerRelays::figures(double now) const {
  nlohmann::json out = nlohmann::json::array();
  for (const Member& m : store_.members()) {
    if (m.state != MemberState::kRelaying) continue;
    const auto links = links_.find(m.name);
    const auto f = figures_.find(m.name);
    const RelayFigures r = f == figures_.end() ? RelayFigures{} : f->second;
    out.push_back({{"name", m.name},
                   {"address", m.advertise},
                   {"alive", alive(m, now)},
                   {"links", links == links_.end() ? 0 : links->second.pairs.size()},
                   {"messages_forwarded", r.messages},
                   {"bytes_forwarded", r.bytes},
                   {"bytes_waiting", r.waiting},
                   {"refused", r.refused}});
  }
  return out;
}

}  // namespace cairn::coordinator
