// RunView: the whole run as the coordinator sees it (docs/OPERATIONS.md "Watching a run"). The
// coordinator's thread feeds it what it hears — members joining and their states, the placement
// (cluster, stage), heartbeats (state, step), events (leaving, results, lost, replaced), and the
// volunteers' `metrics` batches (node/volunteer/VolunteerMetrics.h: their metrics.jsonl records, run plan
// and state changes); readers render it:
//   snapshot()    one JSON document (schema below), what the web page draws
//   prometheus()  the same figures in Prometheus' text exposition format (/metrics;
//                 coordinator/PrometheusText.h)
//   coordinator/TerminalView renders snapshot() on the coordinator's terminal
// Every record taken is appended to <out>/metrics.jsonl as the volunteer wrote it plus "node",
// "cluster", "stream" and "seq" (tools/plot_metrics reads that file for a volunteer run). A
// restarted coordinator reads the file back: its figures continue, and batches resent after the
// restart are not taken twice (each stream's next record number is known).
//
// How the web server gets it: Coordinator::view() returns this object (const: snapshot() and
// prometheus() may be called from any thread, e.g. cpp-httplib's, while the coordinator runs).
//
// snapshot() schema (strings raw: volunteer text is NOT escaped here, the page escapes it):
//   {"run": {"phase", "now", "started_at", "num_clusters", "members", "records", "dropped"},
//    "clusters": [{"id", "nodes": [names, Root→Leaf], "step", "max_steps"|null, "loss"|null,
//                  "samples_per_s"|null, "eta_s"|null, "loss_history": [[step, loss]] (≤ 500),
//                  "eval_history": [[step, name, value]], "throughput_history": [[step, sps]]}],
//    "nodes": [{"name", "cluster"|null, "stage"|null, "role": root|stem|leaf|whole|spare|relay, "state",
//               "address", "heartbeat_age_s"|null, "step", "compute_s"|null, "send_s"|null,
//               "wait_s"|null}],
//    "events": [{"t", "node", "kind", "message"}] (newest last, ≤ 200),
//    "credit": [{"volunteer", "key", "node", "steps", "samples", "compute_s", "sent_bytes"}]
//    "relay": null, or (--relay) {"messages_forwarded", "bytes_forwarded", "bytes_waiting",
//             "links": [{"from", "to", "bytes"}], "refused": {reason: count}}
//    "relays": [{"name", "address", "alive", "links", "messages_forwarded", "bytes_forwarded",
//                "bytes_waiting", "refused"}] (the volunteers' relays, VolunteerRelays::figures)
//    "links": {} before a plan, else {"direct", "dial_out", "relayed", "not_direct": [{"a", "b",
//              "via": "dial-out" | a relay's name}]} (VolunteerRelays::linksView)
//               (coordinator/Credit.h; what setCredit was given last)}
// "phase" is the run's as a user reads it: the coordinator's (setPhase: "gathering" while
// volunteers join, "planned" once the assignments are sent, "done" once the results are merged),
// except that a planned run is "training" once a step record of a placed node was taken (its
// volunteers train; records read back from metrics.jsonl count).
// A cluster's figures come from its Leaf's records: step, loss; samples_per_s = the mean of the
// last 20 steps' samples_per_s; eta_s = (max_steps − step) × batch_size / samples_per_s (plan from
// the Root's "plan" event). A node's compute_s/send_s/wait_s: means over its last 20 steps.
//
// Ownership: owns its state and the metrics.jsonl stream. Thread-safety: every member locks one
// mutex; writers are the coordinator's thread, readers any thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

struct Member;

double unixNow();

// A node of the plan: its cluster and stage of num_stages.
struct Placement {
  std::string name;
  int cluster = 0, stage = 0, num_stages = 1;
};

class RunView {
 public:
  // `out`: the coordinator's folder (metrics.jsonl read back and appended to); empty: no file.
  // `placement`: the plan's nodes when there is a plan (a restarted coordinator), so that the
  // records read back count for their clusters.
  explicit RunView(const std::string& out, const std::vector<Placement>& placement = {});
  ~RunView();
  RunView(const RunView&) = delete;
  RunView& operator=(const RunView&) = delete;

  // --- the coordinator's thread ---
  void setPhase(const std::string& phase);
  void setStartedAt(double unix_s);
  void setNumClusters(int num_clusters);
  // The members as the store holds them: new ones and changed states or addresses become events.
  void syncMembers(const std::vector<Member>& members, double now);
  void place(const Placement& p);
  void heartbeat(const std::string& name, const std::string& state, int64_t step, double now);
  void event(const std::string& node, const std::string& kind, const std::string& message, double now);
  // Takes the records of `batch` not taken yet (from a member whose key the caller checked);
  // returns the acknowledgement to send back.
  // `taken` (may be null) gets the records taken now, in order (not those held already).
  MetricsAck ingest(const MetricsBatch& batch, double now, std::vector<nlohmann::json>* taken = nullptr);
  // The most steps any cluster's plan runs (its Root's "plan" event); 0: no plan seen yet.
  int64_t plannedSteps() const;
  // The credit table (coordinator/Credit.h creditJson) the snapshot shows from now on.
  void setCredit(nlohmann::json credit);
  // The coordinator's relay's figures (CoordinatorRelay::figures), shown as "relay" from now on.
  void setRelay(nlohmann::json relay);
  // The volunteers' relays (VolunteerRelays::figures), shown as "relays"; the plan's links by
  // how they are made (VolunteerRelays::linksView), shown as "links".
  void setRelays(nlohmann::json relays);
  void setLinks(nlohmann::json links);

  // --- any thread ---
  // Copies the figures under the lock and builds the JSON outside it: built under it, 1,000
  // nodes' JSON (~140 ms) held the coordinator's loop at its next heartbeat or metrics batch.
  nlohmann::json snapshot(double now) const;
  nlohmann::json snapshot() const { return snapshot(unixNow()); }
  std::string prometheus(double now) const;
  std::string prometheus() const { return prometheus(unixNow()); }

 private:
  struct Figures;  // what snapshot() shows (copyable)
  struct State;    // the figures, and the metrics.jsonl file
  mutable std::mutex mutex_;
  std::unique_ptr<State> s_;
};

}  // namespace cairn::coordinator
