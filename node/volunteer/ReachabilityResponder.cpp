#include "node/volunteer/ReachabilityResponder.h"

#include <chrono>

#include "core/Error.h"
#include "core/Log.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/protocol/Coordination.h"

namespace cairn {
namespace {

constexpr size_t kMaxReachMessageBytes = 64 << 10;
constexpr const char* kCoordinatorUser = "coordinator";

}  // namespace

ReachabilityResponder::ReachabilityResponder(zmq::context_t& context, const CurveKeyPair& own,
                                             const std::string& coordinator_key,
                                             const std::string& listen)
    : context_(context) {
  authenticator_ = std::make_unique<ZapAuthenticator>(
      context_, std::map<std::string, std::string>{{coordinator_key, kCoordinatorUser}});
  socket_ = coordinationServer(context_, own, listen, kMaxReachMessageBytes, &bound_);
  // The monitor tells when the listener's file descriptor is closed (stop()).
  const std::string monitor_endpoint =
      "inproc://cairn-reach-monitor-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  if (zmq_socket_monitor(static_cast<void*>(socket_), monitor_endpoint.c_str(), ZMQ_EVENT_CLOSED) != 0)
    CAIRN_THROW(InternalError, "zmq_socket_monitor: ", zmq_strerror(zmq_errno()));
  monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
  monitor_.set(zmq::sockopt::linger, 0);
  monitor_.connect(monitor_endpoint);
  thread_ = std::thread([this] { run(); });
  CAIRN_INFO("answering the coordinator's reachability check on ", bound_);
}

ReachabilityResponder::~ReachabilityResponder() { stop(); }

void ReachabilityResponder::run() {
  uint64_t too_many_frames = 0;
  while (!stop_.load()) {
    std::optional<Routed> in;
    try {
      in = recvRouted(socket_, std::chrono::milliseconds(100), &too_many_frames);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    dropped_ = dropped_.load() + too_many_frames;
    too_many_frames = 0;
    if (!in) continue;
    std::string why;
    const auto message = decodeReach(in->frames, &why);
    const ReachCheck* check = message ? std::get_if<ReachCheck>(&*message) : nullptr;
    if (!check || in->user_id != kCoordinatorUser) {
      ++dropped_;
      CAIRN_DEBUG("reachability responder: dropped a message: ",
                  why.empty() ? std::string("not a reach check") : why);
      continue;
    }
    ++answered_;  // before the answer: whoever reads it sees the count
    sendRouted(socket_, in->routing_id, encode(ReachOk{check->nonce}));
  }
  // Release the port: unbind, then wait for the listener's "closed" event.
  try {
    socket_.unbind("tcp://" + bound_);
    zmq::pollitem_t item{static_cast<void*>(monitor_), 0, ZMQ_POLLIN, 0};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool closed = false;
    while (!closed && std::chrono::steady_clock::now() < deadline) {
      try {
        zmq::poll(&item, 1, std::chrono::milliseconds(100));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
        continue;
      }
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t event, endpoint;
      if (!monitor_.recv(event, zmq::recv_flags::dontwait)) continue;
      if (event.more()) (void)monitor_.recv(endpoint, zmq::recv_flags::dontwait);
      uint16_t id = 0;
      if (event.size() >= sizeof id) std::memcpy(&id, event.data(), sizeof id);
      closed = id == ZMQ_EVENT_CLOSED;
    }
    if (!closed) CAIRN_WARN("reachability responder: ", bound_, " was not released within 5 s");
  } catch (const zmq::error_t& e) {
    CAIRN_WARN("reachability responder: releasing ", bound_, ": ", e.what());
  }
  zmq_socket_monitor(static_cast<void*>(socket_), nullptr, 0);
  socket_.close();
  monitor_.close();
}

void ReachabilityResponder::stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  refused_at_stop_ = authenticator_ ? authenticator_->rejected() : 0;
  authenticator_.reset();
  CAIRN_INFO("reachability responder on ", bound_, " closed (", answered_.load(), " checks answered, ",
             dropped_.load(), " messages dropped, ", refused_at_stop_, " connections refused)");
}

}  // namespace cairn
