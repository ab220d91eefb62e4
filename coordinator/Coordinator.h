// Coordinator: `clusterize --serve`. Volunteers join by invite; once enough have joined it plans
// with the existing planner, sends each placed volunteer its stage, node.json and job.json, keeps
// the others as spares, and collects the trained stages at the end, merging them into
// <out>/trained.pt and trained.safetensors. docs/OPERATIONS.md "Volunteers join".
//
// It is never on the training hot path: activations, gradients and ring syncs go directly between
// volunteers; the coordinator only hears heartbeats and results. Its state is in
// <out>/coordinator.db (CoordinatorStore), its key in <out>/coordinator.key (0600), so a restarted
// coordinator has the same invite and picks the run up where it was.
//
// One thread: a loop over the ROUTER socket (volunteers' DEALERs) and the pending reachability
// checks; planning, lost members and growth every 200 ms of it (they read every member row).
// Group commit (Outbox.h): the store writes of the messages handled in a row are one SQLite
// transaction, committed when the queue is empty or after 10 ms; the replies wait for that commit.
// Chunk pieces are read on ChunkService's worker.
// tools/bench/coordinator_load measures it under thousands of volunteers (BENCHMARKS.md "Churn").
// Every message is decoded by node/protocol/Coordination and checked against the sender's CURVE
// key (ZAP User-Id): a volunteer can only speak for itself. A malformed message is counted and
// answered with `rejected` where a reply makes sense; nothing a volunteer sends can stop the loop.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "clusterize/Clusterize.h"
#include "coordinator/FloodGuard.h"

namespace cairn::coordinator {

class RunView;

struct CoordinatorOptions {
  std::string listen = "0.0.0.0:7000";  // what the ROUTER binds (port 0: the kernel picks)
  std::string advertise;                // host:port in the invite; empty: listen (not 0.0.0.0)
  std::string out = "node_data";        // coordinator.db, coordinator.key, plan, results
  int min_volunteers = 1;               // plan once this many have joined …
  int max_volunteers = 0;               // … and this many (0: = min) or `gather` has passed
  std::chrono::milliseconds gather{30000};
  std::chrono::milliseconds reach_timeout{5000};
  // A placed volunteer silent this long is lost; a waiting spare takes its node over
  // (MemberReplacer.h, --lost-after-s).
  std::chrono::milliseconds lost_after{15000};
  // A placed volunteer whose connections to the coordinator all closed (its process ended) and that
  // sent nothing since is lost after this long instead (ConnectionWatch.h, --gone-after-s); 0: off.
  std::chrono::milliseconds gone_after{3000};
  std::string token;                    // empty: the stored one, else a fresh random one
  std::set<std::string> allowed_keys;   // empty: any key holding the token
  std::string invite_file;              // also write the invite here
  size_t max_attachment_bytes = size_t(1) << 31;
  std::function<bool()> stop_requested;  // checked every loop turn (signals)
  // The live view printed on stdout every this long while serving (TerminalView.h); 0: none.
  std::chrono::milliseconds view_every{0};
  // Growing (--grow, --max-clusters, --keep-spares): spares that can hold one more pipeline form a
  // new cluster mid-run (Grower.h). Off by default.
  bool grow = false;
  int max_clusters = 0;  // 0: no limit
  int keep_spares = 0;   // spares growth leaves waiting for replacements
  FloodLimits flood;     // what one key may send (FloodGuard.h)
  // --relay HOST:PORT [--relay-advertise HOST:PORT]: the coordinator relays links between two
  // dial-out-only volunteers that no placement avoids (CoordinatorRelay.h). Empty: it does not.
  std::string relay_listen, relay_advertise;
  // Tests: called on the planning thread before the first plan is made (Gathering.h).
  std::function<void()> before_plan;
};

struct CoordinatorStats {
  uint64_t messages = 0;
  uint64_t malformed = 0;     // dropped: undecodable or from a key that is not a member
  uint64_t refused_joins = 0;
  uint64_t flood_dropped = 0;  // over a key's budget (FloodGuard.h), never decoded
  uint64_t flood_blocked = 0;  // keys blocked for flooding, so far
  uint64_t chunk_requests_dropped = 0;  // unanswered: too many waiting (ChunkService.h)
  uint64_t routes = 0;  // keys with a route back kept (members, and at most max_keys others)
};

class Coordinator {
 public:
  // `prepared` is the profiled model (clusterize's prepareModel); planning uses it.
  Coordinator(CoordinatorOptions options, clusterize::PreparedModel prepared);
  ~Coordinator();
  // Serves until the run's results are merged (0) or a stop is requested (0, state kept).
  int run();
  const CoordinatorStats& stats() const;
  // The invite volunteers pass to `provider --join` (valid once constructed).
  std::string invite() const;
  // The run as the coordinator sees it (RunView.h): snapshot() and prometheus() may be called
  // from any thread while run() serves (the web server's). Valid once constructed.
  const RunView& view() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn::coordinator
