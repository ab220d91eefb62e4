#include "coordinator/RunView.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "coordinator/CoordinatorStore.h"
#include "coordinator/PrometheusText.h"
#include "core/Log.h"

namespace cairn::coordinator {
namespace {

constexpr size_t kRecent = 20;       // steps averaged for rates and time splits
constexpr size_t kHistoryKept = 1000;  // points kept per series (halved when full)
constexpr size_t kHistoryShown = 500;
constexpr size_t kEventsKept = 200;
constexpr size_t kEvalsKept = 3000;

std::optional<double> number(const nlohmann::json& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::optional<int64_t> integer(const nlohmann::json& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end() || !it->is_number_integer()) return std::nullopt;
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)) return std::nullopt;
  return it->get<int64_t>();
}

std::string text(const nlohmann::json& r, const char* key) {
  auto it = r.find(key);
  return it != r.end() && it->is_string() ? it->get<std::string>() : std::string();
}

nlohmann::json orNull(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

double mean(const std::deque<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? NAN : sum / double(v.size());
}

void pushRecent(std::deque<double>& d, double v) {
  d.push_back(v);
  if (d.size() > kRecent) d.pop_front();
}

// A series of (step, value) points, bounded: when full every other point is dropped (the newest
// is kept); a step at or before the last one (a resumed run) replaces the points from there on.
struct Series {
  std::vector<std::pair<int64_t, double>> points;
  void add(int64_t step, double value) {
    while (!points.empty() && points.back().first >= step) points.pop_back();
    points.emplace_back(step, value);
    if (points.size() >= kHistoryKept) {
      std::vector<std::pair<int64_t, double>> kept;
      for (size_t i = 0; i < points.size(); i += 2) kept.push_back(points[i]);
      if (kept.back() != points.back()) kept.push_back(points.back());
      points = std::move(kept);
    }
  }
  // At most kHistoryShown points, evenly spread, the first and the newest included.
  nlohmann::json shown() const {
    nlohmann::json out = nlohmann::json::array();
    const size_t n = points.size();
    const size_t k = std::min(n, kHistoryShown);
    for (size_t i = 0; i < k; ++i) {
      const size_t index = k == 1 ? n - 1 : size_t(std::llround(double(i) * double(n - 1) / double(k - 1)));
      const auto& p = points[index];
      out.push_back({p.first, std::isfinite(p.second) ? nlohmann::json(p.second) : nlohmann::json(nullptr)});
    }
    return out;
  }
};

struct NodeState {
  std::string name, address, member_state, state;
  std::optional<int> cluster, stage;
  int num_stages = 0;
  std::optional<double> last_heartbeat;
  int64_t step = -1;
  std::deque<double> compute, send, wait;
  std::map<std::string, int64_t> next_seq;  // stream → next record number expected
  std::map<std::string, int64_t> dropped;   // stream → records it dropped
};

struct ClusterState {
  int64_t step = -1;
  std::optional<int64_t> max_steps, batch_size;
  std::optional<double> loss;
  std::deque<double> rates;
  Series loss_history, throughput_history;
  std::deque<std::tuple<int64_t, std::string, double>> evals;
};

std::string role(const NodeState& n) {
  if (n.member_state == "relaying") return "relay";
  if (!n.cluster || !n.stage) return "spare";
  if (n.num_stages <= 1) return "whole";
  if (*n.stage == 0) return "root";
  if (*n.stage == n.num_stages - 1) return "leaf";
  return "stem";
}

// At most kMaxEventText bytes of `text`, not cutting a UTF-8 sequence (volunteer text: a long
// message would otherwise be kept 200 times over).
constexpr size_t kMaxEventText = 512;
std::string clip(const std::string& text) {
  if (text.size() <= kMaxEventText) return text;
  size_t end = kMaxEventText;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "…";
}

// The mean of `d`, null when empty.
nlohmann::json meanOrNull(const std::deque<double>& d) {
  return d.empty() ? nlohmann::json(nullptr) : nlohmann::json(mean(d));
}

// Cluster `id` in the snapshot: its chain of nodes (Root→Leaf) and its Leaf's figures.
nlohmann::json clusterJson(int id, const ClusterState& c,
                           const std::map<std::string, NodeState>& nodes) {
  std::vector<const NodeState*> chain;
  for (const auto& [name, n] : nodes)
    if (n.cluster == id && n.stage) chain.push_back(&n);
  std::sort(chain.begin(), chain.end(), [](auto* a, auto* b) { return *a->stage < *b->stage; });
  nlohmann::json names = nlohmann::json::array();
  for (auto* n : chain) names.push_back(n->name);
  const double rate = mean(c.rates);
  std::optional<double> eta;
  if (c.max_steps && c.batch_size && rate > 0 && c.step >= 0)
    eta = double(std::max<int64_t>(0, *c.max_steps - c.step)) * double(*c.batch_size) / rate;
  nlohmann::json evals = nlohmann::json::array();
  for (const auto& [step, name, value] : c.evals)
    evals.push_back(
        {step, name, std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr)});
  return {{"id", id},
          {"nodes", names},
          {"step", std::max<int64_t>(c.step, 0)},
          {"max_steps", c.max_steps ? nlohmann::json(*c.max_steps) : nlohmann::json(nullptr)},
          {"loss", orNull(c.loss)},
          {"samples_per_s", c.rates.empty() ? nlohmann::json(nullptr) : nlohmann::json(rate)},
          {"eta_s", orNull(eta)},
          {"loss_history", c.loss_history.shown()},
          {"eval_history", evals},
          {"throughput_history", c.throughput_history.shown()}};
}

nlohmann::json nodeJson(const NodeState& n, double now) {
  return {{"name", n.name},
          {"cluster", n.cluster ? nlohmann::json(*n.cluster) : nlohmann::json(nullptr)},
          {"stage", n.stage ? nlohmann::json(*n.stage) : nlohmann::json(nullptr)},
          {"role", role(n)},
          {"state", n.state.empty() ? n.member_state : n.state},
          {"address", n.address},
          {"heartbeat_age_s", n.last_heartbeat
                                  ? nlohmann::json(std::max(0.0, now - *n.last_heartbeat))
                                  : nlohmann::json(nullptr)},
          {"step", std::max<int64_t>(n.step, 0)},
          {"compute_s", meanOrNull(n.compute)},
          {"send_s", meanOrNull(n.send)},
          {"wait_s", meanOrNull(n.wait)}};
}

}  // namespace

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct RunView::Figures {
  std::string phase = "gathering";  // the coordinator's: gathering, planned, done
  bool stepped = false;  // a placed node's step record was taken: its volunteers train
  double started_at = 0;
  int num_clusters = 0;
  uint64_t records = 0;
  std::map<std::string, NodeState> nodes;
  std::map<int, ClusterState> clusters;
  std::deque<nlohmann::json> events;
  nlohmann::json credit = nlohmann::json::array();  // setCredit's
  nlohmann::json relay;                              // setRelay's (null: no relay)
  nlohmann::json relays = nlohmann::json::array();   // setRelays'
  nlohmann::json links = nlohmann::json::object();    // setLinks'

  // The run's phase as a user reads it: the coordinator's, except that a planned run whose
  // placed volunteers have sent step records is training.
  std::string shownPhase() const { return phase == "planned" && stepped ? "training" : phase; }
};

struct RunView::State : RunView::Figures {
  std::string path;  // <out>/metrics.jsonl, empty: none
  std::ofstream file;

  NodeState& node(const std::string& name) {
    NodeState& n = nodes[name];
    n.name = name;
    return n;
  }

  void addEvent(double t, const std::string& node, const std::string& kind, const std::string& message) {
    events.push_back({{"t", t}, {"node", node}, {"kind", clip(kind)}, {"message", clip(message)}});
    if (events.size() > kEventsKept) events.pop_front();
  }

  bool isLeaf(const NodeState& n) const {
    return n.cluster && n.stage && *n.stage == std::max(1, n.num_stages) - 1;
  }

  // One record of `n` (from a batch, or read back from metrics.jsonl: `now` is then the record's
  // own time when it has one).
  void take(NodeState& n, const nlohmann::json& r, double now) {
    ++records;
    ClusterState* c = n.cluster ? &clusters[*n.cluster] : nullptr;
    const std::string state = text(r, "state");
    if (!state.empty()) {
      n.state = state;
      addEvent(number(r, "t").value_or(now), n.name, state, text(r, "message"));
    }
    if (auto plan = r.find("plan"); plan != r.end() && plan->is_object() && c) {
      if (auto total = integer(*plan, "total_steps")) c->max_steps = *total;
      if (auto batch = integer(*plan, "batch_size")) c->batch_size = *batch;
    }
    if (auto done = r.find("done"); done != r.end() && done->is_object())
      addEvent(now, n.name, "done", std::to_string(integer(*done, "steps").value_or(0)) + " steps");
    const bool leaf = c && isLeaf(n);
    if (auto eval = r.find("eval"); eval != r.end() && eval->is_object() && leaf) {
      const int64_t step = integer(*eval, "step").value_or(c->step);
      for (const char* name : {"loss", "accuracy", "perplexity"}) {
        const auto v = number(*eval, name);
        if (v && (std::string(name) == "loss" || *v >= 0)) c->evals.emplace_back(step, name, *v);
      }
      while (c->evals.size() > kEvalsKept) c->evals.pop_front();
    }
    const auto step = integer(r, "step");
    if (!step || !r.contains("loss")) return;
    if (n.cluster) stepped = true;
    n.step = *step;
    if (auto v = number(r, "compute_s")) pushRecent(n.compute, *v);
    if (auto v = number(r, "send_s")) pushRecent(n.send, *v);
    if (auto v = number(r, "wait_s")) pushRecent(n.wait, *v);
    if (!leaf) return;
    c->step = *step;
    c->loss = number(r, "loss");  // null in the record: a non-finite loss
    c->loss_history.add(*step, c->loss.value_or(NAN));
    if (auto rate = number(r, "samples_per_s")) {
      pushRecent(c->rates, *rate);
      c->throughput_history.add(*step, *rate);
    }
  }

  void append(const NodeState& n, nlohmann::json record, const std::string& stream, int64_t seq) {
    if (!file.is_open()) return;
    record["node"] = n.name;
    record["cluster"] = n.cluster ? nlohmann::json(*n.cluster) : nlohmann::json(nullptr);
    record["stream"] = stream;
    record["seq"] = seq;
    file << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }

  // metrics.jsonl of an earlier coordinator process: figures and stream positions back.
  void readBack() {
    std::error_code ec;
    if (path.empty() || !std::filesystem::exists(path, ec)) return;
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    size_t good = all.rfind('\n');
    good = good == std::string::npos ? 0 : good + 1;
    if (good < all.size()) {  // a line cut short when the coordinator died: dropped
      CAIRN_WARN(path, ": dropping an incomplete last line (", all.size() - good, " bytes)");
      std::filesystem::resize_file(path, good, ec);
    }
    size_t start = 0, line_number = 0, bad = 0;
    while (start < good) {
      const size_t end = all.find('\n', start);
      ++line_number;
      nlohmann::json r = nlohmann::json::parse(all.begin() + long(start), all.begin() + long(end),
                                               nullptr, /*allow_exceptions=*/false);
      start = end + 1;
      const std::string name = r.is_object() ? text(r, "node") : "";
      const std::string stream = r.is_object() ? text(r, "stream") : "";
      const auto seq = r.is_object() ? integer(r, "seq") : std::nullopt;
      if (name.empty() || stream.empty() || !seq) {
        ++bad;
        continue;
      }
      NodeState& n = node(name);
      int64_t& next = n.next_seq[stream];
      next = std::max(next, *seq + 1);
      for (const char* tag : {"node", "cluster", "stream", "seq"}) r.erase(tag);
      take(n, r, number(r, "t").value_or(0));
    }
    if (bad) CAIRN_WARN(path, ": ", bad, " lines without node, stream and seq were skipped");
  }
};

RunView::RunView(const std::string& out, const std::vector<Placement>& placement)
    : s_(std::make_unique<State>()) {
  s_->started_at = unixNow();
  for (const Placement& p : placement) place(p);
  if (out.empty()) return;
  s_->path = out + "/metrics.jsonl";
  s_->readBack();
  s_->file.open(s_->path, std::ios::app | std::ios::binary);
  if (!s_->file) CAIRN_THROW(BadInput, s_->path, ": cannot write the run's metrics");
}

RunView::~RunView() = default;

void RunView::setPhase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->phase = phase;
}
void RunView::setStartedAt(double unix_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->started_at = unix_s;
}
void RunView::setNumClusters(int num_clusters) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->num_clusters = num_clusters;
}

void RunView::syncMembers(const std::vector<Member>& members, double now) {
  std::lock_guard<std::mutex> lock(mutex_);
  // A member renamed away (a spare that took a lost node over holds that node's name now) and
  // never placed under its old name is no longer shown.
  std::set<std::string> names;
  for (const Member& m : members) names.insert(m.name);
  for (auto it = s_->nodes.begin(); it != s_->nodes.end();) {
    if (!names.count(it->first) && !it->second.cluster && !it->second.member_state.empty())
      it = s_->nodes.erase(it);
    else
      ++it;
  }
  for (const Member& m : members) {
    const bool known = s_->nodes.count(m.name) > 0;
    NodeState& n = s_->node(m.name);
    const std::string state = toString(m.state);
    if (!known || n.member_state.empty()) {
      // A lost volunteer's row renamed <name>-lost-<n> appears as a member already lost.
      const bool gone = m.state == MemberState::kLost || m.state == MemberState::kLeft;
      s_->addEvent(now, m.name, gone ? state : "joined", "at " + (m.dial_out_only ? "(dial-out only)" : m.advertise) + " (" + state + ")");
    } else if (n.member_state != state) {
      s_->addEvent(now, m.name, state, "was " + n.member_state);
    }
    if (known && !n.address.empty() && n.address != m.advertise)
      s_->addEvent(now, m.name, "replaced", "now at " + m.advertise + " (was " + n.address + ")");
    if (n.member_state != state && n.member_state != "") n.state = state;
    if (n.state.empty()) n.state = state;
    n.member_state = state;
    n.address = m.advertise;
  }
}

void RunView::place(const Placement& p) {
  std::lock_guard<std::mutex> lock(mutex_);
  NodeState& n = s_->node(p.name);
  n.cluster = p.cluster;
  n.stage = p.stage;
  n.num_stages = p.num_stages;
  s_->clusters[p.cluster];
  s_->num_clusters = std::max(s_->num_clusters, p.cluster + 1);
}

void RunView::heartbeat(const std::string& name, const std::string& state, int64_t step, double now) {
  std::lock_guard<std::mutex> lock(mutex_);
  NodeState& n = s_->node(name);
  n.last_heartbeat = now;
  n.state = state;
  n.step = std::max(n.step, step);
}

void RunView::event(const std::string& node, const std::string& kind, const std::string& message,
                    double now) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->addEvent(now, node, kind, message);
}

int64_t RunView::plannedSteps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t most = 0;
  for (const auto& [id, c] : s_->clusters)
    if (c.max_steps) most = std::max(most, *c.max_steps);
  return most;
}

void RunView::setLinks(nlohmann::json links) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->links = std::move(links);
}

void RunView::setRelays(nlohmann::json relays) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->relays = std::move(relays);
}

void RunView::setRelay(nlohmann::json relay) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->relay = std::move(relay);
}

void RunView::setCredit(nlohmann::json credit) {
  std::lock_guard<std::mutex> lock(mutex_);
  s_->credit = std::move(credit);
}

MetricsAck RunView::ingest(const MetricsBatch& batch, double now, std::vector<nlohmann::json>* taken) {
  std::lock_guard<std::mutex> lock(mutex_);
  NodeState& n = s_->node(batch.name);
  int64_t& next = n.next_seq[batch.stream];
  int64_t& dropped = n.dropped[batch.stream];
  if (batch.dropped > dropped) {
    s_->addEvent(now, batch.name, "dropped",
                 std::to_string(batch.dropped - dropped) + " records dropped by the volunteer's queue");
    dropped = batch.dropped;
  }
  for (size_t i = 0; i < batch.records.size(); ++i) {
    const int64_t seq = batch.seq + int64_t(i);
    if (seq < next) continue;  // held already (a resend)
    s_->append(n, batch.records[i], batch.stream, seq);
    s_->take(n, batch.records[i], now);
    if (taken) taken->push_back(batch.records[i]);
    next = seq + 1;
  }
  if (s_->file.is_open()) s_->file.flush();
  return MetricsAck{batch.name, batch.stream, next};
}

nlohmann::json RunView::snapshot(double now) const {
  Figures s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = *s_;  // the figures only (a few ms at 1,000 nodes); the JSON is built without the lock
  }
  int64_t dropped = 0, members = 0;
  for (const auto& [name, n] : s.nodes) {
    for (const auto& [stream, d] : n.dropped) dropped += d;
    if (!n.member_state.empty()) ++members;
  }
  nlohmann::json out;
  out["run"] = {{"phase", s.shownPhase()},    {"now", now},
                {"started_at", s.started_at}, {"num_clusters", s.num_clusters},
                {"members", members},         {"records", s.records},
                {"dropped", dropped}};
  nlohmann::json clusters = nlohmann::json::array();
  for (const auto& [id, c] : s.clusters) clusters.push_back(clusterJson(id, c, s.nodes));
  out["clusters"] = clusters;
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& [name, n] : s.nodes) nodes.push_back(nodeJson(n, now));
  out["nodes"] = nodes;
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : s.events) events.push_back(e);
  out["events"] = std::move(events);
  out["credit"] = s.credit;
  out["relay"] = s.relay;
  out["relays"] = s.relays;
  out["links"] = s.links;
  return out;
}

std::string RunView::prometheus(double now) const { return prometheusText(snapshot(now)); }

}  // namespace cairn::coordinator
