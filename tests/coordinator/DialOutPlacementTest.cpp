// Where dial-out-only volunteers may sit (coordinator/DialOutPlacement.h): every link of a plan
// (pipeline neighbours, ring members) needs a reachable side; volunteers of equal figures are
// swapped so that it has one (spare slots first, then one colour of the links), or the plan is
// refused; the dial-out-only nodes lose their address in node.json, wherever they are named; the
// links left between two of them go through relays, spread over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <unistd.h>

#include "coordinator/DialOutPlacement.h"
#include "coordinator/RelayedPlacement.h"
#include "coordinator/VolunteerRelays.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "tests/coordinator/MemberRows.h"

namespace cairn::coordinator {
namespace {

PeerRef peerOf(const std::string& name) { return PeerRef{name, "10.0.0." + name.substr(1) + ":7100", ""}; }

// Clusters × stages, node "n<c*stages+s>": pipelines along the stages, one ring per stage.
std::vector<NodeSpec> gridPlan(int clusters, int stages) {
  std::vector<NodeSpec> nodes;
  auto name = [&](int c, int s) { return "n" + std::to_string(c * stages + s); };
  for (int c = 0; c < clusters; ++c)
    for (int s = 0; s < stages; ++s) {
      NodeSpec n;
      n.name = name(c, s);
      n.job_id = "job";
      n.cluster = c;
      n.stage = s;
      n.num_stages = stages;
      n.role = roleForStage(s, stages);
      n.inputs = {BoundaryValue{"x", "tensor", "float32", {8, 4}, 0}};
      n.outputs = {BoundaryValue{"y", "tensor", "float32", {8, 4}, 0}};
      n.address = peerOf(n.name).address;
      if (s > 0) n.upstream = peerOf(name(c, s - 1));
      if (s + 1 < stages) n.downstream = peerOf(name(c, s + 1));
      RingSpec ring;
      ring.id = "ring_" + std::to_string(s);
      ring.parameters = {"w" + std::to_string(s)};
      n.parameters = ring.parameters;
      for (int k = 0; k < clusters; ++k) ring.members.push_back(peerOf(name(k, s)));
      ring.rank = c;
      n.rings.push_back(ring);
      nodes.push_back(n);
    }
  return nodes;
}

std::vector<Member> volunteersOf(const std::vector<bool>& dial_out_only) {
  std::vector<Member> out;
  for (size_t i = 0; i < dial_out_only.size(); ++i) {
    Member m = test_rows::memberRow("n" + std::to_string(i), "k" + std::to_string(i),
                                    dial_out_only[i] ? "" : "10.0.0.1:7100", MemberState::kSpare);
    m.dial_out_only = dial_out_only[i];
    out.push_back(m);
  }
  return out;
}

// The dial-out-only names once slot i is held by volunteers[slots[i]].
std::set<std::string> dialOutSlots(const std::vector<Member>& volunteers, const std::vector<size_t>& slots) {
  std::set<std::string> names;
  for (size_t i = 0; i < slots.size(); ++i)
    if (volunteers[slots[i]].dial_out_only) names.insert(volunteers[i].name);
  return names;
}

TEST(DialOutPlacement, LinksArePipelineNeighboursAndRingMembers) {
  const auto links = planLinks(gridPlan(2, 2));
  using L = std::pair<std::string, std::string>;
  EXPECT_EQ(links, (std::vector<L>{{"n0", "n1"}, {"n0", "n2"}, {"n1", "n3"}, {"n2", "n3"}}));
}

TEST(DialOutPlacement, TwoBehindRoutersInOnePipelineAreSwappedOntoTheDiagonal) {
  const auto nodes = gridPlan(2, 2);
  const auto volunteers = volunteersOf({true, true, false, false});  // cluster 0 both behind NAT
  ASSERT_TRUE(dialOutOnlyLink(nodes, {"n0", "n1"}).has_value());
  const auto slots = reachableNeighbourSlots(nodes, volunteers);
  ASSERT_TRUE(slots.has_value());
  const std::set<std::string> placed_behind = dialOutSlots(volunteers, *slots);
  EXPECT_EQ(placed_behind, (std::set<std::string>{"n0", "n3"}));
  EXPECT_FALSE(dialOutOnlyLink(nodes, placed_behind).has_value());
}

TEST(DialOutPlacement, ASpareSlotTakesADialOutOnlyVolunteerFirst) {
  const auto nodes = gridPlan(2, 2);  // n4 is left out of the plan: a spare
  const auto volunteers = volunteersOf({true, false, false, false, false});
  const auto slots = reachableNeighbourSlots(nodes, volunteers);
  ASSERT_TRUE(slots.has_value());
  EXPECT_EQ(dialOutSlots(volunteers, *slots), (std::set<std::string>{"n4"}));
}

TEST(DialOutPlacement, TooManyBehindRoutersAreRefused) {
  const auto volunteers = volunteersOf({true, true, true, false});
  EXPECT_FALSE(reachableNeighbourSlots(gridPlan(2, 2), volunteers).has_value());
  // Volunteers of other memory are never swapped.
  auto unequal = volunteersOf({true, true, false, false});
  unequal[2].probe_json = R"({"ram_gb":64,"cores":4,"compute_gflops":50,"bandwidth_mbps":1000})";
  unequal[3].probe_json = unequal[2].probe_json;
  EXPECT_FALSE(reachableNeighbourSlots(gridPlan(2, 2), unequal).has_value());
}

TEST(DialOutPlacement, DialOutOnlyNodesLoseTheirAddressWhereverTheyAreNamed) {
  auto nodes = gridPlan(2, 2);
  markDialOutOnly(nodes, {"n1"});
  EXPECT_TRUE(nodes[1].dial_out_only);
  EXPECT_EQ(nodes[1].address, "");
  EXPECT_TRUE(nodes[0].downstream->dial_out_only);
  EXPECT_EQ(nodes[0].downstream->address, "");
  EXPECT_TRUE(nodes[3].rings[0].members[0].dial_out_only);
  EXPECT_FALSE(nodes[0].dial_out_only);
  EXPECT_FALSE(nodes[3].rings[0].members[1].dial_out_only);
  // node.json keeps the mark through a write and a read.
  const NodeSpec again = parseNodeSpec(toJson(nodes[1]), "node.json");
  EXPECT_TRUE(again.dial_out_only);
}

// Relays (assignRelays, relayLinksOf) against a brute-force reference: the links of the plan
// between two dial-out-only nodes, counted from the node specs by hand.
std::set<std::pair<std::string, std::string>> dialOutOnlyPairs(const std::vector<NodeSpec>& nodes) {
  std::set<std::pair<std::string, std::string>> pairs;
  for (const NodeSpec& a : nodes)
    for (const NodeSpec& b : nodes) {
      if (a.name >= b.name || !a.dial_out_only || !b.dial_out_only) continue;
      bool linked = (a.downstream && a.downstream->name == b.name) ||
                    (a.upstream && a.upstream->name == b.name);
      for (const RingSpec& ring : a.rings)
        for (const PeerRef& m : ring.members) linked |= m.name == b.name;
      if (linked) pairs.emplace(a.name, b.name);
    }
  return pairs;
}

// Every entry of `n`'s node.json naming a peer: upstream, downstream, ring members (itself too).
std::vector<PeerRef> peerEntriesOf(const NodeSpec& n) {
  std::vector<PeerRef> refs;
  if (n.upstream) refs.push_back(*n.upstream);
  if (n.downstream) refs.push_back(*n.downstream);
  for (const RingSpec& ring : n.rings) refs.insert(refs.end(), ring.members.begin(), ring.members.end());
  return refs;
}

std::vector<NodeSpec> keyedGrid(int clusters, int stages) {
  std::vector<NodeSpec> nodes = gridPlan(clusters, stages);
  std::map<std::string, std::string> keys;
  for (const NodeSpec& n : nodes) keys[n.name] = std::string(39, 'a') + n.name.back();
  applyPublicKeys(nodes, keys);
  return nodes;
}

TEST(DialOutPlacement, EveryLinkBetweenTwoDialOutOnlyNodesGetsTheLeastLoadedRelay) {
  auto nodes = keyedGrid(3, 2);  // 3 pipelines of 2: 3 pipeline links, 2 rings of 3 (6 links)
  std::set<std::string> behind;
  for (const NodeSpec& n : nodes) behind.insert(n.name);
  behind.erase("n0");  // one reachable node: its links need no relay
  markDialOutOnly(nodes, behind);
  const std::vector<PeerRef::Relay> relays = {{"r1", "10.9.0.1:7102", std::string(40, 'r')},
                                              {"coordinator", "10.9.0.2:7101", std::string(40, 'c')}};
  const auto want = dialOutOnlyPairs(nodes);
  EXPECT_EQ(assignRelays(nodes, relays), want.size());
  std::map<std::string, size_t> load;
  std::set<std::pair<std::string, std::string>> seen;
  for (const std::string relay : {"r1", "coordinator"}) {
    const RelayLinks links = relayLinksOf(nodes, relay);
    load[relay] = links.pairs.size();
    for (const auto& pair : links.pairs) {
      EXPECT_TRUE(seen.insert(pair).second) << pair.first << "-" << pair.second << " on two relays";
      EXPECT_EQ(links.members.at(pair.first), std::string(39, 'a') + pair.first.back());
    }
  }
  EXPECT_EQ(seen, want);
  EXPECT_LE(std::max(load["r1"], load["coordinator"]) - std::min(load["r1"], load["coordinator"]), 1u);
  // Both ends name the same relay for each other; a link to the reachable node has none.
  for (const NodeSpec& n : nodes) {
    for (const PeerRef& ref : peerEntriesOf(n)) {
      if (ref.name == n.name) continue;
      EXPECT_EQ(ref.relay.has_value(), want.count(std::minmax(n.name, ref.name)) > 0) << n.name << "→" << ref.name;
    }
  }
  // node.json keeps the relay through a write and a read, and refuses one for a reachable peer.
  const NodeSpec again = parseNodeSpec(toJson(nodes[1]), "node.json");
  ASSERT_TRUE(again.upstream.has_value() && again.rings[0].members[2].relay.has_value());
  EXPECT_FALSE(again.upstream->relay.has_value());  // n0, reachable
  EXPECT_TRUE(again.rings[0].members[2].relay == nodes[1].rings[0].members[2].relay);
  nlohmann::json bad = toJson(nodes[2]);
  bad["downstream"]["dial_out_only"] = false;
  bad["downstream"]["address"] = "10.0.0.3:7100";
  bad["downstream"]["relay"] = {{"name", "r1"}, {"address", "10.9.0.1:7102"}, {"public_key", std::string(40, 'r')}};
  EXPECT_THROW(parseNodeSpec(bad, "node.json"), BadInput);
}

TEST(DialOutPlacement, WithoutARelayALinkBetweenTwoDialOutOnlyNodesIsRefusedNamingIt) {
  auto nodes = keyedGrid(2, 2);
  markDialOutOnly(nodes, {"n0", "n1"});
  try {
    assignRelays(nodes, {});
    FAIL() << "a link between two dial-out-only nodes was made without a relay";
  } catch (const BadInput& e) {
    EXPECT_NE(std::string(e.what()).find("links n0 and n1"), std::string::npos) << e.what();
  }
  auto fine = keyedGrid(2, 2);
  markDialOutOnly(fine, {"n0", "n3"});  // the diagonal: every link has a reachable side
  EXPECT_EQ(assignRelays(fine, {}), 0u);
}

// The relay each link of `nodes` goes through, read from both ends (they must agree).
std::map<std::pair<std::string, std::string>, std::string> relayOfEachLink(const std::vector<NodeSpec>& nodes) {
  std::map<std::pair<std::string, std::string>, std::string> out;
  for (const NodeSpec& n : nodes) {
    for (const PeerRef& ref : peerEntriesOf(n)) {
      if (ref.name == n.name || !ref.relay) continue;
      const auto link = std::minmax(n.name, ref.name);
      const auto [it, fresh] = out.emplace(link, ref.relay->name);
      EXPECT_TRUE(fresh || it->second == ref.relay->name) << link.first << "-" << link.second;
    }
  }
  return out;
}

TEST(DialOutPlacement, ALostRelaysLinksMoveToTheLeastLoadedLiveRelayAndNoOtherLinkMoves) {
  auto nodes = keyedGrid(3, 2);
  std::set<std::string> behind;
  for (const NodeSpec& n : nodes) behind.insert(n.name);
  markDialOutOnly(nodes, behind);  // every link relayed: 3 pipeline links, 6 ring links
  const PeerRef::Relay r1{"r1", "10.9.0.1:7102", std::string(40, '1')};
  const PeerRef::Relay r2{"r2", "10.9.0.2:7102", std::string(40, '2')};
  const PeerRef::Relay r3{"r3", "10.9.0.3:7102", std::string(40, '3')};
  ASSERT_EQ(assignRelays(nodes, {r1, r2, r3}), 9u);
  const auto before = relayOfEachLink(nodes);
  ASSERT_EQ(before.size(), 9u);
  // r2 is lost: its links (and only they) go to r1 and r3, whichever carries fewer, the first on a tie.
  const std::set<std::string> changed = reassignRelays(nodes, {"r1", "r3"}, {r1, r3});
  const auto after = relayOfEachLink(nodes);
  std::map<std::string, size_t> load;
  std::set<std::string> want_changed;
  for (const auto& [link, relay] : before) {
    if (relay == "r2") {
      want_changed.insert(link.first);
      want_changed.insert(link.second);
      EXPECT_NE(after.at(link), "r2");
    } else {
      EXPECT_EQ(after.at(link), relay) << link.first << "-" << link.second << " moved";
    }
    ++load[after.at(link)];
  }
  EXPECT_EQ(changed, want_changed);
  EXPECT_EQ(load["r1"] + load["r3"], 9u);
  EXPECT_LE(std::max(load["r1"], load["r3"]) - std::min(load["r1"], load["r3"]), 1u);
  // The relay's key travels with it: each end reaches the new relay by its address and key.
  for (const NodeSpec& n : nodes)
    for (const RingSpec& ring : n.rings)
      for (const PeerRef& m : ring.members)
        if (m.relay && m.relay->name == "r3") {
          EXPECT_EQ(m.relay->public_key, r3.public_key);
        }
  // With every relay alive nothing moves; with nowhere to go nothing moves either.
  EXPECT_TRUE(reassignRelays(nodes, {"r1", "r3"}, {r1, r3}).empty());
  EXPECT_TRUE(reassignRelays(nodes, {}, {}).empty());
  EXPECT_EQ(relayOfEachLink(nodes), after);
}

// Where relayed links cost least (RelayedPlacement.h) against a brute-force reference: every way to
// put the reachable volunteers among equal slots, the fewest bytes per step on links joining two
// dial-out-only ones; pipeline links (activations every micro-batch) carry far more than ring links.
double relayedCost(const LinkBytes& bytes, const std::vector<Member>& volunteers, const std::vector<size_t>& taken_by) {
  std::vector<std::string> behind;
  for (size_t slot = 0; slot < taken_by.size(); ++slot)
    if (volunteers[taken_by[slot]].dial_out_only) behind.push_back(volunteers[slot].name);
  return relayedBytesPerStep(bytes, behind);
}

TEST(RelayedPlacement, RelayedLinksGoWhereTheyCarryTheFewestBytesAsABruteForceFinds) {
  // 3 clusters x 2 stages (n0 n1 | n2 n3 | n4 n5), 4 of 6 volunteers dial-out only: some links
  // must be relayed. The planner put the reachable ones at n0 and n2 (both Roots).
  std::vector<Member> volunteers = volunteersOf({false, true, false, true, true, true});
  LinkBytes bytes;
  for (int c = 0; c < 3; ++c) bytes[{"n" + std::to_string(2 * c), "n" + std::to_string(2 * c + 1)}] = 1000;
  for (int s = 0; s < 2; ++s)
    for (int a = 0; a < 3; ++a)
      for (int b = a + 1; b < 3; ++b) bytes[{"n" + std::to_string(2 * a + s), "n" + std::to_string(2 * b + s)}] = 1;
  std::vector<size_t> identity(6);
  for (size_t i = 0; i < 6; ++i) identity[i] = i;
  double best = relayedCost(bytes, volunteers, identity);
  EXPECT_EQ(best, 1000 + 3);  // pipeline 2 and the stage-1 ring (3 pairs) relayed
  for (size_t r1 = 0; r1 < 6; ++r1)  // brute force: every pair of slots for the reachable two
    for (size_t r2 = r1 + 1; r2 < 6; ++r2) {
      std::vector<size_t> taken_by;
      size_t next_behind = 0, next_reachable = 0;
      const size_t behind[] = {1, 3, 4, 5}, reachable[] = {0, 2};
      for (size_t slot = 0; slot < 6; ++slot)
        taken_by.push_back(slot == r1 || slot == r2 ? reachable[next_reachable++] : behind[next_behind++]);
      best = std::min(best, relayedCost(bytes, volunteers, taken_by));
    }
  EXPECT_EQ(best, 1000 + 1 + 1);  // one pipeline must stay relayed; the reachable ones on two stages
  const std::vector<size_t> chosen = cheapestRelayedSlots(bytes, volunteers);
  std::vector<size_t> sorted = chosen;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);  // a permutation of the volunteers
  EXPECT_EQ(relayedCost(bytes, volunteers, chosen), best);
  // A volunteer of other figures is never swapped: n0 with 16 GB keeps its slot.
  volunteers[0].probe_json = R"({"ram_gb":16,"cores":4,"compute_gflops":50,"bandwidth_mbps":1000})";
  EXPECT_EQ(cheapestRelayedSlots(bytes, volunteers)[0], 0u);
  // When the planner's placement is already among the cheapest (reachable at n1 and n4: 1002),
  // it is kept as it is.
  const std::vector<Member> cheap = volunteersOf({true, false, true, true, false, true});
  EXPECT_EQ(relayedCost(bytes, cheap, identity), best);
  EXPECT_EQ(cheapestRelayedSlots(bytes, cheap), identity);
}

TEST(RelayedPlacement, BytesPerStepArePipelineCutsEveryMicrobatchAndRingSharesPerSync) {
  clusterize::PartitionPlan plan;
  plan.microbatches = 4;
  for (int c = 0; c < 2; ++c) {
    clusterize::PlannedCluster cluster;
    for (int s = 0; s < 2; ++s) {
      clusterize::PlannedStage stage;
      stage.node = "n" + std::to_string(2 * c + s);
      stage.sent_bytes = 1000;  // per micro-batch: the Root's activations, the Leaf's gradients
      stage.parameter_count = s == 0 ? 500 : 2000;
      stage.parameters = {"w" + std::to_string(s)};
      cluster.stages.push_back(stage);
    }
    plan.clusters.push_back(cluster);
  }
  plan.rings = {{"ring_0", {"w0"}, {"n0", "n2"}}, {"ring_1", {"w1"}, {"n1", "n3"}}};
  JobSpec job;
  job.training = {{"sync", "average"}, {"local_steps", 5}};
  LinkBytes bytes = linkBytesPerStep(plan, job);
  EXPECT_EQ(bytes.size(), 4u);
  EXPECT_DOUBLE_EQ((bytes[{"n0", "n1"}]), 2 * 1000 * 4);    // activations down, gradients up
  EXPECT_DOUBLE_EQ((bytes[{"n0", "n2"}]), 2 * 500 * 4 / 2.0 / 5);  // fp32, half each, every 5 steps
  EXPECT_DOUBLE_EQ((bytes[{"n1", "n3"}]), 2 * 2000 * 4 / 2.0 / 5);
  job.training = {{"sync", "gradients"}, {"local_steps", 5}};
  EXPECT_DOUBLE_EQ((linkBytesPerStep(plan, job)[{"n1", "n3"}]), 2 * 2000 * 4 / 2.0);  // every step
}

// The coordinator's side of volunteer relays (VolunteerRelays.h) over a real store and node.json
// files: the links of a relay gone (its connections closed, ConnectionWatch.h) move to the other
// volunteer relay, those of a relay silent past the loss timeout to the coordinator's relay (only
// when no volunteer relay is alive), both ends' files say so and are owed an update, and a live
// relay is told exactly the links relayLinksOf reads from the files, again when they change.
TEST(VolunteerRelays, ASilentRelaysLinksMoveAndEachLiveRelayIsToldItsLinks) {
  namespace fs = std::filesystem;
  const std::string out = (fs::temp_directory_path() / ("cairn_vrelays_" + std::to_string(::getpid()))).string();
  fs::remove_all(out);
  fs::create_directories(out);
  auto nodes = keyedGrid(2, 2);
  markDialOutOnly(nodes, {"n0", "n1", "n2", "n3"});
  const PeerRef::Relay r4{"node_4", "10.9.0.4:7102", std::string(39, 'r') + "4"};
  const PeerRef::Relay r5{"node_5", "10.9.0.5:7102", std::string(39, 'r') + "5"};
  const PeerRef::Relay coordinator{"coordinator", "10.9.0.1:7101", std::string(40, 'c')};
  ASSERT_EQ(assignRelays(nodes, {r4, r5}), 4u);  // 2 pipeline links, 2 ring links
  nlohmann::json placed = nlohmann::json::array();
  for (const NodeSpec& n : nodes) {
    fs::create_directories(fs::path(nodeSpecPath(out, n.name)).parent_path());
    writeJsonFile(nodeSpecPath(out, n.name), toJson(n));
    placed.push_back(n.name);
  }
  CoordinatorStore store(out + "/coordinator.db");
  store.setMeta("placed", placed.dump());
  store.setMeta("phase", "planned");
  for (const PeerRef::Relay& r : {r4, r5}) {
    Member m = test_rows::memberRow(r.name, r.public_key, r.address, MemberState::kRelaying);
    m.last_seen = 1000;
    store.putMember(m);
  }
  std::map<std::string, std::vector<RelayLinksUpdate>> told;  // by key
  VolunteerRelays relays(store, out, /*lost_after_s=*/15, /*started_at=*/1000, coordinator,
                         [&](const std::string& key, const Frames& frames) {
                           std::string why;
                           const auto m = decodeToVolunteer(frames, 1 << 20, &why);
                           ASSERT_TRUE(m && std::holds_alternative<RelayLinksUpdate>(*m)) << why;
                           told[key].push_back(std::get<RelayLinksUpdate>(*m));
                         });
  EXPECT_EQ(relays.forPlanning(1010).size(), 2u);  // volunteer relays first: not the coordinator's
  EXPECT_TRUE(relays.poll(1010).empty());
  for (const PeerRef::Relay& r : {r4, r5}) {  // each told its links at once, as the files say
    ASSERT_EQ(told[r.public_key].size(), 1u) << r.name;
    const RelayLinks want = relayLinksOf(nodes, r.name);
    EXPECT_EQ(told[r.public_key][0].name, r.name);
    EXPECT_EQ(told[r.public_key][0].members, want.members);
    EXPECT_EQ(told[r.public_key][0].links, want.pairs);
    EXPECT_EQ(want.pairs.size(), 2u);
  }
  // node_4's connections to the coordinator all closed at 1008 (its process ended; heard at 1007):
  // gone past --gone-after-s 3 at 1011.5, long before 15 s of silence: only its links move. node_5
  // keeps its heartbeats.
  std::map<std::string, double> gone;
  relays.watchConnections({[&gone](const std::string& key) -> std::optional<double> {
                             const auto it = gone.find(key);
                             return it == gone.end() ? std::nullopt : std::optional<double>(it->second);
                           },
                           3});
  gone[r4.public_key] = 1008;
  for (const auto& [name, seen] : {std::pair<std::string, double>{"node_4", 1007}, {"node_5", 1011}}) {
    Member row = *store.memberByName(name);
    row.last_seen = seen;
    store.putMember(row);
  }
  EXPECT_TRUE(relays.poll(1010.5).empty());  // gone 2.5 s only
  const std::set<std::string> changed = relays.poll(1011.5);
  std::vector<NodeSpec> now;
  for (const NodeSpec& n : nodes) now.push_back(readNodeSpec(nodeSpecPath(out, n.name)));
  std::set<std::string> want_changed;
  for (const auto& [a, b] : relayLinksOf(nodes, "node_4").pairs) want_changed.insert({a, b});
  EXPECT_EQ(changed, want_changed);
  EXPECT_TRUE(relayLinksOf(now, "node_4").pairs.empty());
  EXPECT_EQ(relayLinksOf(now, "node_5").pairs.size(), 4u);  // the one live volunteer relay, not the coordinator
  EXPECT_TRUE(relayLinksOf(now, "coordinator").pairs.empty());
  ASSERT_EQ(told[r5.public_key].size(), 2u);  // told its new links at once
  EXPECT_EQ(told[r5.public_key][1].links, relayLinksOf(now, "node_5").pairs);
  EXPECT_EQ(told[r4.public_key].size(), 1u);  // a silent relay is not told
  // node_5 falls silent too (its connections open): everything goes to the coordinator's relay.
  ASSERT_EQ(relays.forPlanning(1025).size(), 1u);  // silent 14 s: still the volunteer relay
  EXPECT_EQ(relays.forPlanning(1025)[0].name, "node_5");
  ASSERT_EQ(relays.forPlanning(1040).size(), 1u);
  EXPECT_EQ(relays.forPlanning(1040)[0].name, "coordinator");
  EXPECT_EQ(relays.poll(1040).size(), 4u);
  now.clear();
  for (const NodeSpec& n : nodes) now.push_back(readNodeSpec(nodeSpecPath(out, n.name)));
  EXPECT_EQ(relayLinksOf(now, "coordinator").pairs.size(), 4u);
  EXPECT_TRUE(relays.poll(1041).empty());  // nothing left to move
  // The live view's links: 2 pipeline and 2 ring links, every one relayed, each named with its relay.
  const nlohmann::json& view = relays.linksView();
  EXPECT_EQ(view["direct"], 0);
  EXPECT_EQ(view["dial_out"], 0);
  EXPECT_EQ(view["relayed"], 4);
  ASSERT_EQ(view["not_direct"].size(), 4u);
  for (const auto& link : view["not_direct"]) EXPECT_EQ(link["via"], "coordinator");
  fs::remove_all(out);
}

}  // namespace
}  // namespace cairn::coordinator
