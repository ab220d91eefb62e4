// Where dial-out-only volunteers may sit (coordinator/DialOutPlacement.h): every link of a plan
// (pipeline neighbours, ring members) needs a reachable side; volunteers of equal figures are
// swapped so that it has one (spare slots first, then one colour of the links), or the plan is
// refused; the dial-out-only nodes lose their address in node.json, wherever they are named.
#include <gtest/gtest.h>

#include <map>

#include "coordinator/DialOutPlacement.h"
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

}  // namespace
}  // namespace cairn::coordinator
