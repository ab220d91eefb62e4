#include "coordinator/Gathering.h"

#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn::coordinator {

Gathering::Gathering(CoordinatorStore& store, const clusterize::PreparedModel& prepared,
                     GatheringOptions options, MemberReplacer& replacer, Reply reply)
    : store_(store), prepared_(prepared), o_(std::move(options)), replacer_(replacer), reply_(std::move(reply)) {
  needed_ = std::max(1, o_.min_volunteers);
}

Gathering::~Gathering() {
  if (!planning_.valid()) return;
  CAIRN_INFO("coordinator: stopping once the plan being made is done");
  planning_.wait();
}

std::optional<std::vector<Placement>> Gathering::poll() {
  if (store_.meta("phase").value_or("gathering") != "gathering") return std::nullopt;
  if (planning_.valid()) {
    if (planning_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return std::nullopt;
    return apply();
  }
  // A plan refused for want of a relay is tried again with as many volunteers once one is offered.
  if (o_.relays && o_.relays().size() != relays_tried_) needed_ = std::min(needed_, std::max(1, o_.min_volunteers));
  // Only spares heard lately are planned: one whose process ended, or that is frozen or cut off,
  // would hold a node nobody trains (MemberReplacer::heardLately).
  std::vector<Member> spares;
  const double now = unixNow();
  for (const Member& m : store_.members()) {
    if (m.state != MemberState::kSpare) continue;
    const bool heard = replacer_.heardLately(m, now);
    if (heard) spares.push_back(m);
    if (!heard && unheard_.insert(m.public_key).second)
      CAIRN_WARN("coordinator: ", m.name, " is not heard lately (its connections to the coordinator "
                 "closed, or it is silent): not planned while it stays so");
    else if (heard && unheard_.erase(m.public_key))
      CAIRN_INFO("coordinator: ", m.name, " is heard again: counted for the plan again");
  }
  const int want = std::max(needed_, o_.max_volunteers > 0 ? o_.max_volunteers : needed_);
  if (int(spares.size()) < needed_) {
    enough_since_.reset();
    return std::nullopt;
  }
  if (!enough_since_) {
    enough_since_ = Clock::now();
    CAIRN_INFO("coordinator: ", spares.size(), " volunteers joined; planning when ", want,
               " have joined or in ", o_.gather.count() / 1000.0, " s");
  }
  if (int(spares.size()) < want && Clock::now() - *enough_since_ < o_.gather) return std::nullopt;
  // At most `want` (--max-volunteers, default --min-volunteers) take part, first come first
  // placed; later ones stay spares.
  if (int(spares.size()) > want) spares.resize(size_t(want));
  start(std::move(spares));
  return std::nullopt;
}

void Gathering::start(std::vector<Member> spares) {
  CAIRN_INFO("coordinator: planning ", spares.size(), " volunteers (joins and heartbeats are "
             "answered meanwhile)");
  planned_from_ = spares;
  std::vector<PeerRef::Relay> relays = o_.relays ? o_.relays() : std::vector<PeerRef::Relay>{};
  relays_tried_ = relays.size();
  planning_ = std::async(std::launch::async, [this, spares = std::move(spares), relays = std::move(relays)] {
    if (o_.before_plan) o_.before_plan();
    Made made{planVolunteers(prepared_, spares, o_.out, relays), {}};
    for (const Assignment& a : made.run.assignments) made.encoded.push_back(encode(a));
    return made;
  });
}

std::optional<std::vector<Placement>> Gathering::apply() {
  Made made;
  try {
    made = planning_.get();  // planning_ is empty (not valid) from here
  } catch (const Error& e) {
    needed_ = int(planned_from_.size()) + 1;
    enough_since_.reset();
    CAIRN_WARN("coordinator: cannot plan with ", planned_from_.size(), " volunteers (", e.what(),
               "); waiting for ", needed_);
    return std::nullopt;
  }
  const PlannedRun& run = made.run;
  // Each placed volunteer must still be the spare it was (same row, same key) and heard lately: one
  // that left, died or came back under another name meanwhile would hold a node nobody trains.
  for (const Member& was : planned_from_) {
    const auto now = store_.memberByName(was.name);
    if (!now || now->state != MemberState::kSpare || now->public_key != was.public_key) {
      CAIRN_WARN("coordinator: ", was.name, " is no longer a waiting spare; planning again");
      return std::nullopt;  // poll() starts another plan from the spares of now
    }
    if (!replacer_.heardLately(*now, unixNow())) {
      CAIRN_WARN("coordinator: ", was.name, " is no longer heard (its connections closed, or it is "
                 "silent); planning again without it");
      return std::nullopt;
    }
  }
  std::cout << run.report << std::flush;
  std::vector<Placement> placed_nodes;
  for (size_t i = 0; i < run.assignments.size(); ++i) {
    const Assignment& a = run.assignments[i];
    store_.setState(a.name, MemberState::kAssigned);
    reply_(store_.memberByName(a.name)->public_key, made.encoded[i]);
    placed_nodes.push_back({a.name, a.node.value("cluster", 0), a.node.value("stage", 0),
                            a.node.value("num_stages", 1)});
  }
  nlohmann::json placed = nlohmann::json::array();
  for (const Assignment& a : run.assignments) placed.push_back(a.name);
  store_.setMeta("placed", placed.dump());
  store_.setMeta("num_clusters", std::to_string(run.num_clusters));
  store_.setMeta("phase", "planned");
  CAIRN_INFO("coordinator: planned ", run.num_clusters, " cluster(s) on ", run.assignments.size(),
             " volunteers", run.unplaced.empty() ? "" : "; spares: " + std::to_string(run.unplaced.size()));
  for (const Member& m : store_.members()) {  // the spares hear why they wait
    if (m.state != MemberState::kSpare) continue;
    const std::string note = replacer_.spareNote(m);
    CAIRN_INFO("coordinator: told ", m.name, ": ", note);
    reply_(m.public_key, encode(Accepted{m.name, toString(m.state), note, ""}));
  }
  return placed_nodes;
}

}  // namespace cairn::coordinator
