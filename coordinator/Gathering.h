// Gathering: the coordinator's first plan. While the run's phase is "gathering" it waits for
// enough spares (--min-volunteers, then --max-volunteers or --gather-s), plans them on a worker
// thread of its own and, once that plan is made, applies it on the loop: each placed volunteer
// assigned (its stage sent), meta "placed", "num_clusters" and phase "planned", the spares told why
// they wait. Planning 1,000 volunteers takes 17-23 s (docs/BENCHMARKS.md "Churn"); made on the loop
// it held every join, heartbeat and metrics batch for that long, and the replacer then had to
// forget the silence it caused. Off the loop, they are answered meanwhile; volunteers that join
// while a plan is made stay spares. Only spares heard lately are planned (MemberReplacer::
// heardLately: not silent past --lost-after-s, connections not all closed past --gone-after-s). A
// plan whose volunteer is no longer such a spare when it is done (it left, died, or came back under
// a new name) is dropped and made again from the spares of then.
// A plan that fails (these volunteers cannot hold the model) waits for one volunteer more.
// Ownership: borrows the store, the model and the replacer (for the spares' notes); owns the
// worker. Thread-safety: poll() on the loop's thread only; the worker touches no store, only the
// planner and the files it writes under `out` (node_data, which nothing reads before the plan).
#pragma once

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "clusterize/Clusterize.h"
#include "coordinator/CoordinatorStore.h"
#include "coordinator/MemberReplacer.h"
#include "coordinator/RunAssembly.h"
#include "coordinator/RunView.h"
#include "node/volunteer/CoordinationSocket.h"

namespace cairn::coordinator {

struct GatheringOptions {
  std::string out;                  // the coordinator's folder (node_data)
  int min_volunteers = 1;           // plan once this many spares have joined …
  int max_volunteers = 0;           // … and this many (0: = min) or `gather` has passed
  std::chrono::milliseconds gather{30000};
  // The relays offered now (VolunteerRelays::forPlanning: the volunteers' relays, else the
  // coordinator's own, --relay), asked on the loop when a plan starts: links no swap makes
  // reachable use them. Empty function: none.
  std::function<std::vector<PeerRef::Relay>()> relays;
  // Tests: called on the worker before it plans (to hold a plan while the loop is checked).
  std::function<void()> before_plan;
};

class Gathering {
 public:
  using Reply = std::function<void(const std::string& public_key, const Frames& frames)>;
  Gathering(CoordinatorStore& store, const clusterize::PreparedModel& prepared,
            GatheringOptions options, MemberReplacer& replacer, Reply reply);
  ~Gathering();  // waits for a plan being made (its files are the next plan's to replace)
  Gathering(const Gathering&) = delete;
  Gathering& operator=(const Gathering&) = delete;

  // In phase "gathering": starts a plan when enough spares wait, applies one that is made. When
  // this call applied one (the phase is "planned" now): the placed nodes, for the live view (read
  // from the plan, not from 1,000 node.json files that list 1,000 ring members each).
  std::optional<std::vector<Placement>> poll();
  bool planning() const { return planning_.valid(); }

 private:
  using Clock = std::chrono::steady_clock;
  // What the worker makes: the plan, and each assignment already encoded (1,000 assignments
  // carrying node.json files of 1,000 ring members each took seconds to encode on the loop).
  struct Made {
    PlannedRun run;
    std::vector<Frames> encoded;  // run.assignments', in order
  };
  void start(std::vector<Member> spares);
  std::optional<std::vector<Placement>> apply();

  CoordinatorStore& store_;
  const clusterize::PreparedModel& prepared_;
  GatheringOptions o_;
  MemberReplacer& replacer_;
  Reply reply_;
  int needed_ = 1;  // spares needed before planning (grows when a plan fails)
  size_t relays_tried_ = 0;  // relays offered to the last plan started
  std::optional<Clock::time_point> enough_since_;
  std::set<std::string> unheard_;  // keys of spares not heard lately, told so in the log once
  std::vector<Member> planned_from_;  // the spares the plan being made places
  std::future<Made> planning_;
};

}  // namespace cairn::coordinator
