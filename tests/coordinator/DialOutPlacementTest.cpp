// Where dial-out-only volunteers may sit (coordinator/DialOutPlacement.h): every link of a plan
// (pipeline neighbours, ring members) needs a reachable side; volunteers of equal figures are
// swapped so that it has one (spare slots first, then one colour of the links), or the plan is
// refused; the dial-out-only nodes lose their address in node.json, wherever they are named; the
// links left between two of them go through relays, spread over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "coordinator/DialOutPlacement.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
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
    std::vector<PeerRef> refs;
    if (n.upstream) refs.push_back(*n.upstream);
    if (n.downstream) refs.push_back(*n.downstream);
    for (const RingSpec& ring : n.rings) refs.insert(refs.end(), ring.members.begin(), ring.members.end());
    for (const PeerRef& ref : refs) {
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

}  // namespace
}  // namespace cairn::coordinator
