#include "node/volunteer/VolunteerSession.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/Error.h"
#include "core/Log.h"
#include "core/NodeConfigs.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/VolunteerAssignment.h"
#include "node/volunteer/VolunteerSockets.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// At most kMaxReasonBytes, cut at a UTF-8 character boundary (the header must stay valid JSON).
std::string shortReason(std::string text) {
  if (text.size() <= kMaxReasonBytes) return text;
  size_t cut = kMaxReasonBytes - 3;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

std::string readWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot read the trained stage to upload it");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

VolunteerSession::VolunteerSession(VolunteerConfig config)
    : config_(std::move(config)), workdir_(config_.workdir) {
  bool created = false;
  identity_ = workdir_.loadOrCreateIdentity(&created);
  CAIRN_INFO(created ? "made this volunteer's key pair in " : "this volunteer's key pair is in ",
             workdir_.identityPath(), " (public key ", identity_.public_key, ")");
  coordinator_ = describeCoordinator(config_.invite);
  if (auto m = workdir_.readMembership()) {  // validated here: a bad file is reported at once
    if (m->coordinator_key == config_.invite.coordinator_key) {
      asked_name_ = m->name;
      CAIRN_INFO("rejoining as ", asked_name_, " (", workdir_.membershipPath(), ")");
    } else {
      CAIRN_INFO(workdir_.membershipPath(), " names another coordinator (", m->coordinator,
                 "); joining as a new volunteer");
    }
  }
}

VolunteerSession::~VolunteerSession() {
  accept_responder_.reset();
  responder_.reset();
  closeMainSocket();
}

zmq::socket_t& VolunteerSession::mainSocket(bool immediate) {
  if (socket_ && socket_immediate_ == immediate) return socket_;
  closeMainSocket();
  // With immediate (the result upload): one message queued at most, so a result resent while
  // the previous copy is still queued waits instead of piling up.
  socket_ = volunteerSocket(context_, identity_, config_.invite, immediate, config_.max_message_bytes,
                            immediate ? 1 : 0);
  socket_immediate_ = immediate;
  return socket_;
}

void VolunteerSession::closeMainSocket() {
  if (socket_) socket_.close();
}

void VolunteerSession::noAnswer(const std::string& what) const {
  CAIRN_THROW(PeerLost, coordinator_, " did not answer ", what, " within ",
              secondsOf(config_.coordinator_timeout), " s. Is it running, and reachable from this "
              "machine? A wrong coordinator key in the invite looks exactly like this (a CURVE "
              "handshake with the wrong key fails silently): check that the invite is the one "
              "`clusterize --serve` printed");
}

void VolunteerSession::refused(const std::string& reason) const {
  CAIRN_THROW(BadInput, "the coordinator refused to join: ", reason,
              asked_name_.empty()
                  ? std::string()
                  : " (this volunteer asked for its earlier name " + asked_name_ +
                        ", remembered in " + workdir_.membershipPath() +
                        "; remove that file to join as a new volunteer)");
}

std::optional<ToVolunteer> VolunteerSession::receive(Clock::time_point deadline) {
  for (;;) {
    if (stopRequested()) return std::nullopt;
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    uint64_t dropped = 0;
    // A bounded wait, so that a stop asked for without a signal (tests) is seen too.
    auto frames = recvFrames(socket_, std::min(left, milliseconds(100)), &dropped);
    if (dropped) {
      malformed_ += dropped;
      CAIRN_WARN(coordinator_, " sent a message of more than ", kMaxCoordinationFrames,
                 " frames (dropped)");
    }
    if (!frames) continue;
    std::string why;
    auto message = decodeToVolunteer(*frames, config_.max_message_bytes, &why);
    if (!message) {
      ++malformed_;
      CAIRN_WARN(coordinator_, " sent a malformed message (dropped): ", why);
      continue;
    }
    return message;
  }
}

void VolunteerSession::startResponder() {
  if (responder_) return;
  if (config_.listen.empty()) {  // dial-out only: nothing to answer the dial-back with
    listen_bound_.clear();
    advertised_.clear();
    return;
  }
  responder_ = std::make_unique<ReachabilityResponder>(context_, identity_,
                                                       config_.invite.coordinator_key, config_.listen);
  listen_bound_ = responder_->bound();
  advertised_ = config_.advertise.empty() ? listen_bound_ : config_.advertise;
  startAcceptResponder();
}

// --listen's port + 1 answers the dial-back too: peers behind routers will connect there.
void VolunteerSession::startAcceptResponder() {
  std::string host;
  int port = 0;
  parseHostPort(listen_bound_, "--listen", "--listen", &host, &port);
  const std::string accept = listen_bound_.substr(0, listen_bound_.rfind(':') + 1) + std::to_string(port + 1);
  try {
    accept_responder_ = std::make_unique<ReachabilityResponder>(
        accept_context_, identity_, config_.invite.coordinator_key, accept);
  } catch (const Error& e) {
    CAIRN_WARN("cannot answer the reachability check on ", accept, " (", e.what(),
               "): volunteers behind routers could not connect here, so the coordinator will "
               "take this volunteer as dial-out only");
  }
}

// Bandwidth: one message of probe_bytes, timed until its acknowledgement.
std::optional<double> VolunteerSession::timeBandwidthProbe(zmq::socket_t& socket, size_t probe_bytes) {
  const auto start = Clock::now();
  if (!sendWhenConnected(socket, encode(BandwidthProbeMsg{std::string(probe_bytes, '\0')}),
                         config_.coordinator_timeout, config_.stop_requested)) {
    if (stopRequested()) return std::nullopt;
    noAnswer("(its connection took no bandwidth probe)");
  }
  const auto probe_deadline = start + config_.coordinator_timeout;
  for (bool acked = false; !acked;) {
    auto message = receive(probe_deadline);
    if (!message) {
      if (stopRequested()) return std::nullopt;
      noAnswer("the bandwidth probe (" + std::to_string(config_.probe_megabytes) + " MiB)");
    }
    if (auto* r = std::get_if<Rejected>(&*message)) refused(r->reason);
    if (auto* ack = std::get_if<BandwidthAck>(&*message)) {
      if (ack->bytes != int64_t(probe_bytes))
        CAIRN_THROW(BadInput, coordinator_, " acknowledged ", ack->bytes,
                    " bytes of the bandwidth probe, not the ", probe_bytes, " sent");
      acked = true;
    } else {
      CAIRN_DEBUG("ignored a message from the coordinator while probing bandwidth");
    }
  }
  return std::max(secondsOf(Clock::now() - start), 1e-6);
}

void VolunteerSession::relayBound(const std::string& bound) {
  listen_bound_ = bound;
  advertised_ = config_.advertise.empty() ? bound : config_.advertise;
}

std::optional<Accepted> VolunteerSession::join(VolunteerProbe machine) {
  if (!config_.relay_mbps) startResponder();
  zmq::socket_t& socket = mainSocket();

  const size_t probe_bytes = size_t(config_.probe_megabytes) << 20;
  const std::optional<double> elapsed_probe = timeBandwidthProbe(socket, probe_bytes);
  if (!elapsed_probe) return std::nullopt;
  const double elapsed = *elapsed_probe;
  bandwidth_mbps_ = double(probe_bytes) * 8 / 1e6 / elapsed;
  machine.bandwidth_mbps = bandwidth_mbps_;
  CAIRN_INFO("probe: ", machine.ram_gb, " GB RAM, ", machine.cores, " cores, ",
             machine.compute_gflops, " GFLOPS, ", bandwidth_mbps_, " Mbit/s to the coordinator (",
             config_.probe_megabytes, " MiB in ", elapsed, " s), GPUs: ", describeGpus(machine.gpus),
             ", libtorch ", machine.libtorch);

  JoinAsk ask{config_.invite.token, advertised_, machine, asked_name_, config_.relay_mbps};
  if (!sendWhenConnected(socket, encode(ask), config_.coordinator_timeout, config_.stop_requested)) {
    if (stopRequested()) return std::nullopt;
    noAnswer("(its connection took no join)");
  }
  CAIRN_INFO("asked ", coordinator_, " to join", config_.relay_mbps ? " as a relay, " : ", ",
             advertised_.empty() ? "with no address (dial-out only)" : "advertising " + advertised_,
             asked_name_.empty() ? std::string() : " as " + asked_name_);
  const auto join_deadline = Clock::now() + config_.coordinator_timeout;
  for (;;) {
    auto message = receive(join_deadline);
    if (!message) {
      if (stopRequested()) return std::nullopt;
      noAnswer("the join");
    }
    if (auto* r = std::get_if<Rejected>(&*message)) refused(r->reason);
    if (auto* a = std::get_if<Accepted>(&*message)) {
      if (const std::string why = whyNotANodeName(a->name); !why.empty())
        CAIRN_THROW(BadInput, coordinator_, " accepted this volunteer under the name \"", a->name,
                    "\", which ", why);
      name_ = a->name;
      workdir_.writeMembership({config_.invite.address(), config_.invite.coordinator_key, name_});
      CAIRN_INFO("joined as ", name_, " (", a->state, "); remembered in ", workdir_.membershipPath());
      if (!a->note.empty()) CAIRN_INFO("the coordinator says: ", a->note);
      if (!a->reachability.empty()) CAIRN_INFO(a->reachability);
      return *a;
    }
    CAIRN_DEBUG("ignored a message from the coordinator while waiting for the join's answer");
  }
}

AssignmentWait VolunteerSession::waitForAssignment(const std::function<bool()>& leave_when,
                                                   const std::function<std::string()>& leave_reason) {
  CAIRN_ENFORCE(!name_.empty(), "waitForAssignment before join");
  zmq::socket_t& socket = mainSocket();
  Frames beat = encode(Heartbeat{name_, "waiting", -1});
  const auto start = Clock::now();
  auto next_beat = start;
  auto next_log = start + config_.waiting_log_interval;
  AssignmentWait out;
  for (;;) {
    if (stopRequested()) {
      sendLeaving("stopped");
      out.end = AssignmentWait::End::kStopped;
      return out;
    }
    const auto now = Clock::now();
    if (now >= next_beat && leave_when && leave_when()) {
      sendLeaving(leave_reason ? leave_reason() : std::string("leaving"));
      out.end = AssignmentWait::End::kLeft;
      return out;
    }
    if (now >= next_beat) {
      (void)trySendFrames(socket, beat);  // not queued (high-water mark): the next one goes
      next_beat = now + config_.heartbeat_interval;
    }
    if (now >= next_log) {
      CAIRN_INFO("waiting for an assignment from ", coordinator_, " for ",
                 int64_t(secondsOf(now - start)), " s");
      next_log = now + config_.waiting_log_interval;
    }
    auto message = receive(std::min(next_beat, next_log));
    if (!message) continue;
    if (auto* a = std::get_if<Assignment>(&*message)) return takeAssignment(*a);
    if (auto* f = std::get_if<Finished>(&*message)) {
      out.end = AssignmentWait::End::kFinished;
      out.reason = f->reason;
      return out;
    }
    if (auto* r = std::get_if<Rejected>(&*message)) refused(r->reason);
    if (auto* a = std::get_if<Accepted>(&*message)) {
      if (a->name != name_ && a->state == "assigned") {
        takeOverNode(a->name);
        beat = encode(Heartbeat{name_, "waiting", -1});
        continue;
      }
      if (a->note.empty())
        CAIRN_INFO("the coordinator confirms ", a->name, " (", a->state, ")");
      else
        CAIRN_INFO("the coordinator says: ", a->note);
      continue;
    }
    CAIRN_DEBUG("ignored a message from the coordinator while waiting for an assignment");
  }
}

// What a dial-out-only node's log says of its links at its assignment: how many peers it dials,
// how many it reaches through which relay.
static std::string dialOutOnlyLine(const NodeSpec& node) {
  std::set<std::string> relays;
  size_t relayed = 0, direct = 0;
  auto count = [&](const PeerRef& p) {
    if (p.name == node.name) return;
    if (p.relay) {
      ++relayed;
      relays.insert(p.relay->name + " at " + p.relay->address);
    } else {
      ++direct;
    }
  };
  if (node.upstream) count(*node.upstream);
  if (node.downstream) count(*node.downstream);
  for (const RingSpec& ring : node.rings)
    for (const PeerRef& m : ring.members) count(m);
  std::string through;
  for (const std::string& r : relays) through += (through.empty() ? "" : ", ") + r;
  return "dial-out only: this node dials its " + std::to_string(direct) + " reachable peer entr" +
         (direct == 1 ? "y" : "ies") +
         (relayed ? " and reaches " + std::to_string(relayed) + " through the relay " + through
                  : std::string()) +
         "; nothing dials it";
}

AssignmentWait VolunteerSession::takeAssignment(const Assignment& a) {
  CheckedAssignment checked;
  try {
    checked = checkAssignment(a, name_, identity_.public_key, coordinator_);
  } catch (const BadInput& e) {
    sendLeaving(shortReason(std::string("invalid assignment: ") + e.what()));
    throw;
  }
  const WrittenAssignment written = workdir_.writeAssignment(checked, identity_);
  AssignmentWait out;
  out.node_data = written.node_data;
  out.resume = written.resume;
  out.name = name_;
  out.end = AssignmentWait::End::kAssigned;
  accept_responder_.reset();  // releases --listen's port + 1 for the training transport
  responder_.reset();         // releases --listen for the training transport
  CAIRN_INFO("assigned: cluster ", checked.node.cluster, " of ", a.num_clusters, ", stage ",
             checked.node.stage + 1, "/", checked.node.num_stages, " of job ",
             checked.job.job_id, "; written to ", out.node_data);
  if (checked.node.dial_out_only) CAIRN_INFO(dialOutOnlyLine(checked.node));
  else if (checked.node.address != advertised_)
    CAIRN_WARN("the assignment's node.json address is ", checked.node.address,
               " but this volunteer advertised ", advertised_, " (peers will dial ",
               checked.node.address, ")");
  return out;
}

void VolunteerSession::takeOverNode(const std::string& name) {
  // A spare chosen to take a lost volunteer's node over: it holds that node's name from
  // now on (its checkpoints name it); the assignment follows.
  if (const std::string why = whyNotANodeName(name); !why.empty())
    CAIRN_THROW(BadInput, coordinator_, " gave this volunteer the name \"", name,
                "\", which ", why);
  CAIRN_INFO("taking over the node ", name, " of a lost volunteer (this spare was ",
             name_, ")");
  name_ = name;
  workdir_.writeMembership({config_.invite.address(), config_.invite.coordinator_key, name_});
}

std::unique_ptr<VolunteerHeartbeats> VolunteerSession::trainingHeartbeats(
    VolunteerHeartbeats::Progress progress) {
  CAIRN_ENFORCE(!name_.empty(), "trainingHeartbeats before join");
  closeMainSocket();
  return std::make_unique<VolunteerHeartbeats>(context_, identity_, config_.invite, name_,
                                               "training", config_.heartbeat_interval,
                                               std::move(progress));
}

std::unique_ptr<VolunteerMetrics> VolunteerSession::metricsStream() {
  CAIRN_ENFORCE(!name_.empty(), "metricsStream before join");
  return std::make_unique<VolunteerMetrics>(context_, identity_, config_.invite, name_,
                                            config_.metrics);
}

std::unique_ptr<VolunteerCheckpoints> VolunteerSession::checkpointUploads(
    const std::string& checkpoint_dir) {
  CAIRN_ENFORCE(!name_.empty(), "checkpointUploads before join");
  if (config_.upload_mbps <= 0) {
    CAIRN_INFO("checkpoint uploads are off (--upload-mbps 0)");
    return nullptr;
  }
  CheckpointUploadOptions options;
  options.upload_mbps = config_.upload_mbps;
  options.poll = config_.checkpoint_poll;
  CAIRN_INFO("uploading new checkpoints of ", checkpoint_dir, " to the coordinator at up to ",
             config_.upload_mbps, " Mbit/s");
  return std::make_unique<VolunteerCheckpoints>(context_, identity_, config_.invite, name_,
                                                checkpoint_dir, options);
}

bool VolunteerSession::uploadResult(const nlohmann::json& summary, const std::string& weights_path) {
  CAIRN_ENFORCE(!name_.empty(), "uploadResult before join");
  const Frames message = encode(ResultUpload{name_, summary, readWholeFile(weights_path)});
  zmq::socket_t& socket = mainSocket(/*immediate=*/true);
  const auto deadline = Clock::now() + config_.result_wait;
  for (int attempt = 1; Clock::now() < deadline && !stopRequested(); ++attempt) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (!sendWhenConnected(socket, message, left, config_.stop_requested)) break;
    if (attempt == 1)
      CAIRN_INFO("uploaded the results (", message[1].size(), " bytes of trained stage) to ",
                 config_.invite.address());
    else if (attempt == 2)
      CAIRN_INFO("the coordinator has not acknowledged the results yet; resending every ",
                 secondsOf(config_.result_resend), " s for up to ", secondsOf(config_.result_wait), " s");
    else
      CAIRN_DEBUG("results resent, attempt ", attempt);
    const auto attempt_deadline = std::min(deadline, Clock::now() + config_.result_resend);
    while (auto reply = receive(attempt_deadline)) {
      if (auto* ack = std::get_if<ResultAck>(&*reply); ack && ack->name == name_) {
        CAIRN_INFO("the coordinator has the results");
        return true;
      }
      if (auto* r = std::get_if<Rejected>(&*reply)) {
        CAIRN_WARN("the coordinator refused the results: ", r->reason);
        return false;
      }
    }
  }
  return false;
}

void VolunteerSession::sendLeaving(const std::string& reason) {
  if (name_.empty()) return;
  zmq::socket_t& socket = mainSocket(/*immediate=*/false);
  socket.set(zmq::sockopt::linger, 2000);  // the context's end waits up to 2 s for it
  if (trySendFrames(socket, encode(LeavingNotice{name_, shortReason(reason)})))
    CAIRN_INFO("told the coordinator this volunteer leaves (", shortReason(reason), ")");
  closeMainSocket();
  forgetNode();
}

void VolunteerSession::forgetNode() {
  // The node is given up: a later join comes back without asking for its name.
  std::error_code ignored;
  if (std::filesystem::remove(workdir_.membershipPath(), ignored))
    CAIRN_INFO("gave up the node ", name_, " (", workdir_.membershipPath(), " removed)");
  name_.clear();
  asked_name_.clear();
}

}  // namespace cairn
