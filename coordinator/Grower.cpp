#include "coordinator/Grower.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "coordinator/Growth.h"
#include "coordinator/RunAssembly.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/Log.h"

namespace cairn::coordinator {
namespace {

std::vector<std::string> names(const nlohmann::json& list) {
  return list.is_array() ? list.get<std::vector<std::string>>() : std::vector<std::string>{};
}

std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& n : items) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "nobody" : out;
}

}  // namespace

Grower::Grower(CoordinatorStore& store, std::string out, GrowOptions options, Send send)
    : store_(store), out_(std::move(out)), options_(options), send_(std::move(send)) {}

nlohmann::json Grower::growth() const {
  const auto text = store_.meta("growth");
  return text ? nlohmann::json::parse(*text) : nlohmann::json();
}

void Grower::setGrowth(const nlohmann::json& growth) { store_.setMeta("growth", growth.dump()); }

std::vector<NodeSpec> Grower::poll(double now) {
  if (!options_.enabled || store_.meta("phase").value_or("gathering") != "planned") return {};
  if (now - last_poll_ < 0.5) return {};
  last_poll_ = now;
  const nlohmann::json g = growth();
  const std::string state = g.is_object() ? g.value("state", "") : "";
  if (state == "abandoned") return {};
  if (state == "proposed") {
    for (const auto& [root, accepted] : g["roots"].items())
      if (!accepted.get<bool>()) return {};
    return assign();
  }
  propose(now);
  return {};
}

void Grower::propose(double) {
  const auto placed_text = store_.meta("placed");
  if (!placed_text) return;
  const std::vector<std::string> placed = names(nlohmann::json::parse(*placed_text));
  const int clusters = std::stoi(store_.meta("num_clusters").value_or("1"));
  if (options_.max_clusters > 0 && clusters >= options_.max_clusters) return;
  // A new cluster of spares heard lately only: a dead or frozen spare would hold a node nobody
  // trains.
  std::vector<Member> members;
  for (const Member& m : store_.members())
    if (m.state != MemberState::kSpare || !options_.heard_lately || options_.heard_lately(m))
      members.push_back(m);
  size_t spares = 0;
  for (const Member& m : members) spares += m.state == MemberState::kSpare ? 1 : 0;
  std::vector<NodeSpec> nodes;
  for (const std::string& name : placed) nodes.push_back(readNodeSpec(nodeSpecPath(out_, name)));
  if (nodes.empty()) return;
  const int stages = nodes.front().num_stages;
  if (spares < size_t(stages + std::max(options_.keep_spares, 0))) return;
  // Each stage needs the RAM of the volunteer holding it in the lowest cluster (the template).
  std::vector<const NodeSpec*> templates(size_t(stages), nullptr);
  for (const NodeSpec& n : nodes)
    if (n.stage >= 0 && n.stage < stages &&
        (!templates[size_t(n.stage)] || n.cluster < templates[size_t(n.stage)]->cluster))
      templates[size_t(n.stage)] = &n;
  std::vector<double> ram(size_t(stages), 0);
  for (int s = 0; s < stages; ++s) {
    if (!templates[size_t(s)]) return;
    if (const auto holder = store_.memberByName(templates[size_t(s)]->name))
      ram[size_t(s)] = probedRamGb(*holder);
  }
  const std::vector<PeerRef::Relay> relays =
      options_.relays ? options_.relays() : std::vector<PeerRef::Relay>{};
  const auto chosen = chooseLinkableGrowth(members, ram, options_.keep_spares, nodes, !relays.empty());
  if (!chosen) return;
  const std::vector<DealEntry> deal = grownDeal(loadDeal(store_, clusters), newest_epoch_);
  const JobSpec job = readJobSpec(jobSpecPath(out_));
  const int64_t epochs = job.training.value("epochs", int64_t(1));
  const int64_t max_steps = job.training.value("max_steps", int64_t(0));
  if (max_steps <= 0 && epochs > 0 && deal.back().from_epoch >= epochs) {
    if (!told_no_epochs_)
      CAIRN_INFO("coordinator: spares could form cluster ", clusters, " but the run's last epoch (",
                 epochs - 1, ") has begun; not growing");
    told_no_epochs_ = true;
    return;
  }
  const GrowthPlan plan = planGrowth(nodes, *chosen, clusters, relays);
  std::vector<std::string> added, told, roots;
  for (const NodeSpec& n : plan.added) {
    NodeSpec node = n;
    node.extra["public_key"] = store_.memberByName(n.name)->public_key;
    const NodeSpec& from = *templates[size_t(n.stage)];
    std::filesystem::create_directories(nodeDirectory(out_, n.name));
    std::filesystem::copy_file(nodeDirectory(out_, from.name) + "/" + from.stage_file,
                               nodeDirectory(out_, n.name) + "/" + node.stage_file,
                               std::filesystem::copy_options::overwrite_existing);
    writeJsonFile(nodeSpecPath(out_, n.name), toJson(node));
    added.push_back(n.name);
  }
  for (const NodeSpec& n : plan.told) {
    writeJsonFile(nodeSpecPath(out_, n.name), toJson(n));
    told.push_back(n.name);
  }
  nlohmann::json answered = nlohmann::json::object();
  for (const NodeSpec& n : nodes)
    if (n.stage == 0) answered[n.name] = false;
  for (const std::string& name : added) store_.setState(name, MemberState::kAssigned);
  nlohmann::json g = {{"state", "proposed"}, {"cluster", clusters}, {"spares", added},
                      {"told", told},        {"roots", answered},   {"deal", nlohmann::json::parse(dealJson(deal))}};
  setGrowth(g);
  writeDeal(g);
  CAIRN_INFO("coordinator: growing: cluster ", clusters, " from spares ", listed(added),
             " from epoch ", deal.back().from_epoch, " (deal ", dealJson(deal),
             "); peers to tell: ", listed(told), "; waiting for the Roots to take the deal");
}

void Grower::writeDeal(const nlohmann::json& g) {
  // The running nodes are offered the deal (extra.offered_deal; extra.deal stays the deal in
  // force until every Root took it: assign()); the new cluster starts with it in force.
  editNodes(names(g["told"]), [&](NodeSpec& node) { node.extra["offered_deal"] = g["deal"]; });
  editNodes(names(g["spares"]), [&](NodeSpec& node) { node.extra["deal"] = g["deal"]; });
  oweUpdates(g);
}

void Grower::editNodes(const std::vector<std::string>& nodes, const std::function<void(NodeSpec&)>& edit) {
  for (const std::string& name : nodes) {
    NodeSpec node = readNodeSpec(nodeSpecPath(out_, name));
    edit(node);
    writeJsonFile(nodeSpecPath(out_, name), toJson(node));
  }
}

void Grower::oweUpdates(const nlohmann::json& g) {
  const std::vector<std::string> told = names(g["told"]);
  store_.setMeta("growth_peers_pending", nlohmann::json(std::set<std::string>(told.begin(), told.end())).dump());
}

void Grower::observe(const std::string& name, const std::vector<nlohmann::json>& records) {
  for (const nlohmann::json& r : records) {
    if (!r.is_object()) continue;
    if (r.contains("epoch") && r["epoch"].is_number_integer() && r.contains("step"))
      newest_epoch_ = std::max(newest_epoch_, r["epoch"].get<int64_t>());
    if (!r.contains("deal") || !r["deal"].is_object()) continue;
    nlohmann::json g = growth();
    if (!g.is_object() || g.value("state", "") != "proposed" || !g["roots"].contains(name)) continue;
    const nlohmann::json& d = r["deal"];
    if (!d.contains("deal") || d["deal"] != g["deal"]) continue;  // an answer to an older offer
    const bool accepted = d.value("accepted", false);
    const int64_t epoch = d.contains("epoch") && d["epoch"].is_number_integer() ? d["epoch"].get<int64_t>() : -1;
    if (accepted) {
      g["roots"][name] = true;
      setGrowth(g);
      CAIRN_INFO("coordinator: ", name, " took the deal ", g["deal"].dump(), " at step ",
                 d.value("step", int64_t(-1)));
      continue;
    }
    const int64_t from = g["deal"].back()["from_epoch"].get<int64_t>();
    if (epoch >= from) {
      CAIRN_INFO("coordinator: ", name, " was already in epoch ", epoch, " when the deal from epoch ",
                 from, " came; dealing again");
      redeal(epoch);
    } else {
      abandon(name + " refused the deal: " + d.value("reason", std::string("no reason given")));
    }
  }
}

void Grower::redeal(int64_t reported_epoch) {
  nlohmann::json g = growth();
  std::vector<DealEntry> deal = parseDeal(g["deal"].dump(), "coordinator.db meta \"growth\"");
  deal.pop_back();
  newest_epoch_ = std::max(newest_epoch_, reported_epoch);
  // Epochs shorter than the round trip (update, the Roots' agreement, their answer) would be
  // missed again and again: the k-th deal again starts 2^k epochs after the newest reported one
  // (2, 4, 8, …), so the margin outgrows the round trip after log2(round trip / epoch) tries;
  // never past the run's last epoch.
  const int64_t redeals = g.value("redeals", int64_t(0)) + 1;
  g["redeals"] = redeals;
  const int64_t ahead = (int64_t(1) << std::min<int64_t>(redeals, 20)) - 1;
  std::vector<DealEntry> next = grownDeal(deal, newest_epoch_ + ahead);
  const JobSpec job = readJobSpec(jobSpecPath(out_));
  const int64_t epochs = job.training.value("epochs", int64_t(1));
  if (job.training.value("max_steps", int64_t(0)) <= 0 && epochs > 0 && next.back().from_epoch >= epochs) {
    if (newest_epoch_ + 1 >= epochs || deal.back().from_epoch + 1 >= epochs)
      return abandon("the run's last epoch has begun");
    next.back().from_epoch = epochs - 1;
  }
  g["deal"] = nlohmann::json::parse(dealJson(next));
  for (auto& [root, accepted] : g["roots"].items()) accepted = false;
  setGrowth(g);
  writeDeal(g);
  CAIRN_INFO("coordinator: growing: cluster ", g["cluster"].get<int>(), " dealt again from epoch ",
             next.back().from_epoch, "; peers to tell again: ", listed(names(g["told"])));
}

void Grower::abandon(const std::string& why) {
  nlohmann::json g = growth();
  for (const std::string& name : names(g["spares"])) store_.setState(name, MemberState::kSpare);
  g["state"] = "abandoned";
  g["reason"] = why;
  setGrowth(g);
  // The existing node.json files go back to what they were before the proposal (no newcomer in
  // their rings, the deal in force): a spare that later replaces one of these nodes gets no ring
  // member that will never come, and no deal nobody took. Each told member is owed that as a
  // peers update too (its held newcomers dropped, its own node.json restored for a restart).
  const std::vector<std::string> spares = names(g["spares"]);
  editNodes(names(g["told"]), [&](NodeSpec& node) {
    for (RingSpec& ring : node.rings)
      ring.members.erase(std::remove_if(ring.members.begin(), ring.members.end(),
                                        [&](const PeerRef& m) {
                                          return std::find(spares.begin(), spares.end(), m.name) != spares.end();
                                        }),
                         ring.members.end());
    node.extra.erase("offered_deal");
  });
  oweUpdates(g);
  CAIRN_WARN("coordinator: growth abandoned for this run (", why, "); the spares wait for replacements");
}

// plan.json gains the new cluster (a copy of cluster 0's entry with the new nodes) and each ring
// its new holder, so the merge (clusterize --merge, the coordinator's at the end) sees it.
void Grower::addToPlan(const std::vector<NodeSpec>& added, int cluster) {
  const std::string path = planPath(out_);
  nlohmann::json plan = readJsonFile(path);
  if (!plan.contains("clusters") || !plan["clusters"].is_array() || plan["clusters"].empty())
    CAIRN_THROW(InternalError, path, ": no clusters to copy");
  nlohmann::json entry = plan["clusters"][0];
  entry["index"] = cluster;
  entry["chain"] = nlohmann::json::array();
  std::map<std::string, std::string> successor;  // cluster 0's node → the new node of its stage
  for (const NodeSpec& n : added) {
    for (auto& st : entry["stages"])
      if (st.value("stage", -1) == n.stage) {
        successor[st.value("node", std::string())] = n.name;
        st["node"] = n.name;
        st["address"] = n.address;
      }
  }
  for (const auto& st : entry["stages"]) entry["chain"].push_back(st["node"]);
  plan["clusters"].push_back(entry);
  if (plan.contains("rings") && plan["rings"].is_array())
    for (auto& ring : plan["rings"]) {
      auto& holders = ring["holders"];
      if (holders.is_array() && !holders.empty() && successor.count(holders[0].get<std::string>()))
        holders.push_back(successor[holders[0].get<std::string>()]);
    }
  if (plan.contains("num_clusters")) plan["num_clusters"] = cluster + 1;
  writeJsonFile(path, plan);
}

std::vector<NodeSpec> Grower::assign() {
  nlohmann::json g = growth();
  const JobSpec job = readJobSpec(jobSpecPath(out_));
  std::vector<NodeSpec> assigned;
  nlohmann::json placed = nlohmann::json::parse(store_.meta("placed").value_or("[]"));
  for (const std::string& name : names(g["spares"])) {
    const NodeSpec node = readNodeSpec(nodeSpecPath(out_, name));
    Assignment a;
    a.name = name;
    a.node = toJson(node);
    a.job = toJson(job);
    a.num_clusters = node.extra.value("num_clusters", 1);
    a.stage = readFileBytes(nodeDirectory(out_, name) + "/" + node.stage_file);
    const auto member = store_.memberByName(name);
    if (member) send_(member->public_key, encode(a));
    placed.push_back(name);
    assigned.push_back(node);
  }
  store_.setMeta("placed", placed.dump());
  // Every Root took the deal: it is in force in the running nodes' node.json too, and each is
  // owed that update (a volunteer restarting after a pause plans with it).
  editNodes(names(g["told"]), [&](NodeSpec& node) { putDealInForce(node.extra, g["deal"]); });
  oweUpdates(g);
  const int cluster = g["cluster"].get<int>();
  addToPlan(assigned, cluster);
  store_.setMeta("num_clusters", std::to_string(cluster + 1));
  saveDeal(store_, parseDeal(g["deal"].dump(), "coordinator.db meta \"growth\""));
  g["state"] = "done";
  setGrowth(g);
  CAIRN_INFO("coordinator: cluster ", cluster, " formed: assigned ", listed(names(g["spares"])),
             " (deal ", g["deal"].dump(), ")");
  return assigned;
}

void Grower::onHeartbeat(const std::string& name) {
  const auto text = store_.meta("growth_peers_pending");
  if (!text) return;
  std::set<std::string> owed = nlohmann::json::parse(*text).get<std::set<std::string>>();
  if (!owed.count(name)) return;
  const auto m = store_.memberByName(name);
  if (!m) return;
  const NodeSpec node = readNodeSpec(nodeSpecPath(out_, name));
  send_(m->public_key, encode(PeersUpdate{name, toJson(node)}));
  owed.erase(name);
  store_.setMeta("growth_peers_pending", nlohmann::json(owed).dump());
  const std::string state = growth().value("state", "");
  CAIRN_INFO("coordinator: sent ", name,
             state == "abandoned" ? " its rings as before the abandoned growth"
             : state == "done"    ? " the grown deal, now in force"
                                  : " its grown rings and the offered deal");
}

}  // namespace cairn::coordinator
