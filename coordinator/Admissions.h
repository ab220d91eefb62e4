// Admissions: the coordinator carrying out JoinPolicy.h's decisions (docs/OPERATIONS.md
// "Volunteers join"): a join the policy lets in is not accepted yet, because peers will have to
// reach the volunteer:
//   onJoin()  JoinPolicy's checks (the volunteer's libtorch against the plan's, once there is a
//             plan, else against this coordinator's, which will write it), then the coordinator
//             dials the address the volunteer advertises, and its port + 1 (its own DEALERs, CURVE with the
//             volunteer's key) and sends `reach{nonce}`
//   poll()    every loop turn: a volunteer that answered `reach_ok` with the nonce is admitted —
//             a new spare, or a returning member with its row kept — and answered `accepted`; a
//             returning placed volunteer (its process restarted) gets its assignment again. One
//             not heard back within the reach timeout on its port and its port + 1 (where
//             dial-out-only peers connect), or that gave no address at all (provider
//             --join without --listen: no dial-back), is admitted as dial-out only (Member::
//             dial_out_only): its `accepted` carries the one line it prints — why, the address
//             the coordinator saw it come from, the ports to forward to become reachable.
//             A relay's join (`provider --join … --relay`) is checked by attaching to its relay
//             at the advertised address (node/transport/Relay.h: the coordinator's key as the
//             member "coordinator", answered with a presence); admitted as `relaying`, or refused
//             with what to forward when it does not answer: a relay must be reachable.
// Ownership: borrows the store, the ZeroMQ context and the coordinator's keys; owns the pending
// checks' sockets. Replies and refusals go through the coordinator's functions.
// Thread-safety: the coordinator's loop thread only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "coordinator/CoordinatorStore.h"
#include "core/CurveKeys.h"
#include "node/protocol/Coordination.h"
#include "node/volunteer/CoordinationSocket.h"

namespace cairn::coordinator {

struct AdmissionOptions {
  std::string out;                     // the coordinator's folder (the plan, for assignments)
  std::string token;                   // the invite's token
  std::set<std::string> allowed_keys;  // empty: any key holding the token
  std::chrono::milliseconds reach_timeout{5000};
  // What an admitted spare is told about its wait (MemberReplacer::spareNote); may be empty.
  std::function<std::string(const Member&)> spare_note;
};

class Admissions {
 public:
  // Sends `frames` to a ROUTER routing id.
  using SendRouted = std::function<void(const std::string& routing_id, const Frames& frames)>;
  // Sends `frames` to the member holding `public_key` (on its last connection).
  using Send = std::function<void(const std::string& public_key, const Frames& frames)>;
  // Refuses `who` (counted, logged): `rejected{reason}` to `routing_id`.
  using Refuse = std::function<void(const std::string& routing_id, const std::string& who,
                                    const std::string& reason)>;

  Admissions(CoordinatorStore& store, zmq::context_t& context, const CurveKeyPair& keys,
             AdmissionOptions options, SendRouted send_routed, Send send, Refuse refuse);
  ~Admissions();

  // A `join` from `r` (its key checked by ZAP); `run_over`: the run is done, nobody joins.
  void onJoin(const Routed& r, const JoinAsk& ask, bool run_over);
  void poll();

 private:
  struct Pending;
  void admit(const Pending& p, bool reachable);
  std::string reachabilityLine(const Pending& p) const;
  static std::string acceptAddressOf(const std::string& advertise);
  bool placedDialOutOnly(const std::string& name) const;
  static bool answeredOn(zmq::socket_t& socket, const std::string& nonce);
  static bool relayAnswered(zmq::socket_t& socket);
  void refuseRelay(const Pending& p);
  // `m` (a kRejoining member) made assigned or spare; the reason to refuse it, if any.
  std::optional<std::string> rejoin(Member& m, const std::string& advertise);
  void resendAssignment(const Member& m);
  std::string stageFilesLibtorch() const;

  CoordinatorStore& store_;
  zmq::context_t& context_;
  const CurveKeyPair& keys_;
  AdmissionOptions o_;
  SendRouted send_routed_;
  Send send_;
  Refuse refuse_;
  std::vector<std::unique_ptr<Pending>> pending_;
};

}  // namespace cairn::coordinator
