// VolunteerSession: a volunteer's conversation with the coordinator (`provider --join`,
// docs/PROTOCOL.md "Coordination", docs/OPERATIONS.md "Volunteers join"), everything but the
// training itself, so that it runs (and is tested) in-process against any coordinator:
//   join()               answer reachability checks on --listen (ReachabilityResponder), measure
//                        the bandwidth to the coordinator (one `bandwidth` message), send `join`
//                        and wait for `accepted` / `rejected`
//   waitForAssignment()  heartbeat "waiting" until `assignment` (checked: VolunteerAssignment.h;
//                        written into the work folder: VolunteerWorkdir.h) or `finished`; an
//                        `accepted{name, "assigned"}` with another name first makes this spare
//                        the holder of a lost volunteer's node (it takes that name)
//   trainingHeartbeats() the background heartbeats to run while training (VolunteerHeartbeats.h)
//   checkpointUploads()  the background checkpoint uploads while training (VolunteerCheckpoints.h)
//   metricsStream()      the trainer's records streamed in the background (VolunteerMetrics.h)
//   uploadResult()       `result` + trained_stage.pt until `result_ack`
//   sendLeaving()        `leaving{reason}`, best effort; the node is given up (its name forgotten)
// The volunteer's key pair is made once in the work folder and reused; the coordinator is
// authenticated by the key in the invite (a wrong key: no answer, see join()).
//
// Ownership: owns the coordination zmq::context_t (separate from the training transport's: each
// context has its own ZAP handler), the responder and the main DEALER socket.
// Thread-safety: one thread (the volunteer's main thread); trainingHeartbeats() and
// checkpointUploads() run their own.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/volunteer/ActiveHours.h"
#include "node/volunteer/ReachabilityResponder.h"
#include "node/volunteer/VolunteerCheckpoints.h"
#include "node/volunteer/VolunteerHeartbeats.h"
#include "node/volunteer/VolunteerMetrics.h"
#include "node/volunteer/VolunteerWorkdir.h"
#include "node/protocol/Coordination.h"

namespace cairn {

struct VolunteerConfig {
  Invite invite;
  std::string listen;     // host:port the responder (and later the training transport) binds
  std::string advertise;  // host:port peers and the coordinator dial; empty: the bound --listen
  std::string workdir = "cairn-volunteer";
  std::chrono::milliseconds coordinator_timeout{60000};  // for each answer to join / bandwidth
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds waiting_log_interval{60000};
  std::chrono::milliseconds result_wait{600000};  // how long to offer the results
  std::chrono::milliseconds result_resend{5000};  // resend the results when not acknowledged
  int probe_megabytes = 8;                        // bandwidth probe size (MiB)
  double upload_mbps = 50;                        // checkpoint uploads (Mbit/s); 0: off
  // provider --max-mbps: the cap on all it sends (Mbit/s): the checkpoint uploads get upload_mbps
  // of it, the training transport the rest (a SendPacer); 0: no cap.
  double max_mbps = 0;
  std::chrono::milliseconds checkpoint_poll{2000};  // how often to look for a new checkpoint
  MetricsStreamOptions metrics;                   // the trainer's records to the coordinator
  size_t max_message_bytes = size_t(2) << 30;     // largest message taken from the coordinator
  std::function<bool()> stop_requested;           // a signal: stop waiting, say `leaving`
  std::string device = "auto";                    // provider --device (trainer/Device.h)
  // The volunteer's own limits (docs/OPERATIONS.md "Running as a service"). cores: provider
  // --cores, the most cores it gives (its probe reports min(cores, the machine's), measures its
  // GFLOPS on that many threads, and its stage runs at most that many intra-op threads); 0: all.
  // memory_gb: provider --memory-gb, the most RAM it gives (its probe reports min(memory_gb, the
  // machine's), so the planner gives it no bigger stage, and it refuses an assignment whose
  // estimate needs more); 0: all.
  int cores = 0;
  double memory_gb = 0;
  // provider --active-hours (ActiveHours.h): compute only inside this window of local time; at
  // its end the volunteer hands its node over (or, as a spare, leaves) and waits, still running,
  // for the next one; nullopt: at all hours. `clock` reads the minute of the day (volunteerClock).
  std::optional<ActiveHours> active_hours;
  std::function<int()> clock = localMinuteOfDay;
  std::chrono::milliseconds hours_poll{20000};  // how often an idle volunteer looks at the clock
  // provider --relay [--relay-mbps N] (VolunteerRelay.h): this volunteer only relays, at --listen;
  // the value is its cap in Mbit/s (0: none). nullopt: it trains.
  std::optional<double> relay_mbps = std::nullopt;
};

// How waitForAssignment() ended.
struct AssignmentWait {
  // kLeft: `leave_when` said yes (its active hours are over); it said `leaving`.
  enum class End { kAssigned, kFinished, kStopped, kLeft };
  End end = End::kStopped;
  std::string node_data;  // kAssigned: the work folder's node_data/
  std::string name;       // kAssigned: the node name
  bool resume = false;    // kAssigned: the same stage as before, with its checkpoints: resume
  std::string reason;     // kFinished: the coordinator's reason
};

class VolunteerSession {
 public:
  // Opens the work folder and its identity (generated on first use). BadInput for a bad folder,
  // identity.key or membership.json.
  explicit VolunteerSession(VolunteerConfig config);
  ~VolunteerSession();
  VolunteerSession(const VolunteerSession&) = delete;
  VolunteerSession& operator=(const VolunteerSession&) = delete;

  const std::string& publicKey() const { return identity_.public_key; }
  const VolunteerWorkdir& workdir() const { return workdir_; }
  const VolunteerConfig& config() const { return config_; }
  // After join(): the name the coordinator gave, the address --listen bound (the kernel's port
  // for ":0"), what the join advertised, and the bandwidth measured (Mbit/s).
  const std::string& name() const { return name_; }
  const std::string& listenBound() const { return listen_bound_; }
  const std::string& advertised() const { return advertised_; }
  double bandwidthMbps() const { return bandwidth_mbps_; }
  const ReachabilityResponder* responder() const { return responder_.get(); }

  // Binds --listen and starts answering reachability checks (BadInput when it cannot be bound);
  // join() does it when it has not been done (not for a relay: its relay answers there).
  void startResponder();
  // A relay (config().relay_mbps): its relay bound `bound` (host:port), which the join advertises
  // unless --advertise says otherwise; call before join().
  void relayBound(const std::string& bound);
  // A relay's life once joined (VolunteerRelay.cpp): heartbeats "relaying" with `figures()` every
  // heartbeat_interval; each `relay_links` for it goes to `on_links`. Returns true at `finished`,
  // false at a stop (after `leaving`). A `rejected` throws BadInput with its reason.
  bool serveAsRelay(const std::function<void(const RelayLinksUpdate&)>& on_links,
                    const std::function<RelayFigures()>& figures);
  // Starts the responder on --listen (if not yet), measures bandwidth, sends join with `machine` (its
  // bandwidth_mbps is filled in), waits for the answer. A restarted volunteer asks for the name
  // in membership.json (same coordinator key); an accepted one is remembered there.
  // nullopt: stop_requested before an answer. Throws BadInput "the coordinator refused to join:
  // <reason>" on `rejected`; PeerLost when the coordinator does not answer within
  // coordinator_timeout (the message says a wrong key in the invite looks the same).
  std::optional<Accepted> join(VolunteerProbe machine);

  // Heartbeats "waiting" every heartbeat_interval until an assignment, `finished` or a stop.
  // An assignment is checked (BadInput naming the coordinator and what is wrong; the volunteer
  // says `leaving` with that reason first), written to the work folder, and the responder is
  // stopped (its port released for the training transport).
  // `leave_when` (may be empty), asked at every heartbeat: true ends the wait with `leaving`
  // {leave_reason()} (End::kLeft).
  AssignmentWait waitForAssignment(const std::function<bool()>& leave_when = {},
                                   const std::function<std::string()>& leave_reason = {});

  // Closes the main socket (training uses none) and starts "training" heartbeats; their state and
  // step come from `progress` when given (VolunteerMetrics::progress).
  std::unique_ptr<VolunteerHeartbeats> trainingHeartbeats(VolunteerHeartbeats::Progress progress = {});

  // The background stream of the trainer's records to the coordinator (VolunteerMetrics.h).
  std::unique_ptr<VolunteerMetrics> metricsStream();

  // The background checkpoint uploads of `checkpoint_dir` while training (VolunteerCheckpoints.h);
  // null when upload_mbps is 0 (uploads off).
  std::unique_ptr<VolunteerCheckpoints> checkpointUploads(const std::string& checkpoint_dir);

  // Sends `result{name, summary}` + the file at `weights_path` and waits for `result_ack`,
  // resending every result_resend, up to result_wait. False when it was not acknowledged (or a
  // stop was requested, or the coordinator refused it).
  bool uploadResult(const nlohmann::json& summary, const std::string& weights_path);

  // `leaving{name, reason}`, best effort: queued and given up to 2 s to go out when the session
  // ends. Nothing when not joined. The volunteer gives its node up with it: the name is
  // forgotten (membership.json removed), so a later join() comes back without asking for it and
  // the coordinator gives it that node again when nobody took it over, else makes it a spare.
  void sendLeaving(const std::string& reason);
  // The node is given up without a word to the coordinator (it gave the node to a spare already):
  // membership.json removed, the name forgotten, so the next join() asks for no name.
  void forgetNode();

 private:
  zmq::socket_t& mainSocket(bool immediate = false);
  void closeMainSocket();
  // The next valid message on the main socket before `deadline`; nullopt at the deadline or on a
  // stop. Malformed messages are logged and dropped.
  std::optional<ToVolunteer> receive(std::chrono::steady_clock::time_point deadline);
  bool stopRequested() const { return config_.stop_requested && config_.stop_requested(); }
  // join()'s bandwidth probe: seconds until the coordinator acknowledged `probe_bytes` (at least
  // 1 µs); nullopt: a stop was requested first.
  std::optional<double> timeBandwidthProbe(zmq::socket_t& socket, size_t probe_bytes);
  // waitForAssignment(): `a` checked (`leaving` with the reason first when it is not) and written.
  AssignmentWait takeAssignment(const Assignment& a);
  // waitForAssignment(): a spare takes a lost volunteer's node over under its `name`.
  void takeOverNode(const std::string& name);
  [[noreturn]] void noAnswer(const std::string& what) const;
  [[noreturn]] void refused(const std::string& reason) const;

  VolunteerConfig config_;
  VolunteerWorkdir workdir_;
  CurveKeyPair identity_;
  std::string coordinator_;   // "the coordinator at host:port (key …)"
  std::string asked_name_;    // the remembered name sent in join
  std::string name_, listen_bound_, advertised_;
  double bandwidth_mbps_ = 0;
  uint64_t malformed_ = 0;
  zmq::context_t context_;  // declared before the sockets: destroyed after them
  std::unique_ptr<ReachabilityResponder> responder_;
  // The same check on --listen's port + 1, where dial-out-only peers will connect (docs/PROTOCOL.md
  // "Reversed links"): its own context (one ZAP handler per context); none when that port could
  // not be bound (then the coordinator takes this volunteer as dial-out only).
  zmq::context_t accept_context_;
  std::unique_ptr<ReachabilityResponder> accept_responder_;
  void startAcceptResponder();
  zmq::socket_t socket_;  // the main DEALER (null while training)
  bool socket_immediate_ = false;
};

}  // namespace cairn
