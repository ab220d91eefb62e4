#include "node/volunteer/VolunteerSockets.h"

#include <algorithm>

#include "core/Log.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/ZmqSockets.h"

namespace cairn {

zmq::socket_t volunteerSocket(zmq::context_t& context, const CurveKeyPair& own, const Invite& invite,
                              bool immediate, size_t max_message_bytes, int send_high_water_mark) {
  // As coordinationClient, with the options that must be set before connect() (ZeroMQ applies
  // immediate, heartbeats and high-water marks to the connections made after they are set).
  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::maxmsgsize, int64_t(max_message_bytes));
  s.set(zmq::sockopt::curve_publickey, own.public_key);
  s.set(zmq::sockopt::curve_secretkey, own.secret_key);
  s.set(zmq::sockopt::curve_serverkey, invite.coordinator_key);
  s.set(zmq::sockopt::immediate, immediate);
  s.set(zmq::sockopt::heartbeat_ivl, 2000);
  s.set(zmq::sockopt::heartbeat_timeout, 6000);
  if (send_high_water_mark > 0) s.set(zmq::sockopt::sndhwm, send_high_water_mark);
  allowIpv6For(s, invite.address());
  s.connect("tcp://" + invite.address());
  return s;
}

bool trySendFrames(zmq::socket_t& socket, const Frames& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq::send_flags flags = zmq::send_flags::dontwait;
    if (i + 1 < frames.size()) flags = flags | zmq::send_flags::sndmore;
    try {
      // Only the first frame can be refused: ZeroMQ takes the rest of a message it has begun.
      if (!socket.send(zmq::buffer(frames[i]), flags)) return false;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR || i > 0) throw;
      return false;
    }
  }
  return true;
}

bool sendWhenConnected(zmq::socket_t& socket, const Frames& frames, std::chrono::milliseconds timeout,
                       const std::function<bool()>& stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (trySendFrames(socket, frames)) return true;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || (stop && stop())) return false;
    zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLOUT, 0};
    try {
      zmq::poll(&item, 1, std::min(left, std::chrono::milliseconds(100)));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}

std::optional<ToVolunteer> receiveReply(zmq::socket_t& socket, std::chrono::milliseconds wait,
                                        size_t max_message_bytes, const char* what) {
  uint64_t dropped = 0;
  auto frames = recvFrames(socket, std::max(wait, std::chrono::milliseconds(0)), &dropped);
  if (!frames) return std::nullopt;
  std::string why;
  auto message = decodeToVolunteer(*frames, max_message_bytes, &why);
  if (!message) CAIRN_WARN(what, ": the coordinator sent a malformed message (dropped): ", why);
  return message;
}

}  // namespace cairn
