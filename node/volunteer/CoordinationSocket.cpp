#include "node/volunteer/CoordinationSocket.h"

#include <cerrno>

#include "core/Error.h"
#include "node/transport/ZmqSockets.h"

namespace cairn {
namespace {

void curveKeys(zmq::socket_t& s, const CurveKeyPair& own) {
  s.set(zmq::sockopt::curve_publickey, own.public_key);
  s.set(zmq::sockopt::curve_secretkey, own.secret_key);
}

// Receives the remaining frames of a message whose first frame is `first`.
bool rest(zmq::socket_t& socket, zmq::message_t& first, std::vector<zmq::message_t>* parts,
          uint64_t* dropped, size_t max_frames) {
  parts->push_back(std::move(first));
  bool too_many = false;
  while (parts->back().more()) {
    zmq::message_t next;
    if (!socket.recv(next, zmq::recv_flags::dontwait)) break;  // frames of one message arrive together
    if (parts->size() >= max_frames) {
      too_many = true;
      parts->back() = std::move(next);  // keep draining without growing
      continue;
    }
    parts->push_back(std::move(next));
  }
  if (too_many && dropped) ++*dropped;
  return !too_many;
}

// zmq::poll, with a signal's EINTR read as "nothing arrived" (the caller checks its stop flag).
bool readable(zmq::socket_t& socket, std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
  try {
    return zmq::poll(&item, 1, timeout) > 0 && (item.revents & ZMQ_POLLIN);
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw;
  }
}

}  // namespace

zmq::socket_t coordinationClient(zmq::context_t& context, zmq::socket_type type,
                                 const CurveKeyPair& own, const std::string& server_key,
                                 const std::string& address, size_t max_message_bytes) {
  zmq::socket_t s(context, type);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::maxmsgsize, int64_t(max_message_bytes));
  curveKeys(s, own);
  s.set(zmq::sockopt::curve_serverkey, server_key);
  allowIpv6For(s, address);
  s.connect("tcp://" + address);
  return s;
}

zmq::socket_t coordinationServer(zmq::context_t& context, const CurveKeyPair& own,
                                 const std::string& address, size_t max_message_bytes,
                                 std::string* bound) {
  zmq::socket_t s(context, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::maxmsgsize, int64_t(max_message_bytes));
  s.set(zmq::sockopt::curve_server, true);
  curveKeys(s, own);
  std::string endpoint = "tcp://" + address;
  if (endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
    endpoint = endpoint.substr(0, endpoint.size() - 1) + "*";
  try {
    allowIpv6For(s, endpoint);
    s.bind(endpoint);
  } catch (const zmq::error_t& e) {
    CAIRN_THROW(BadInput, "cannot listen on ", address, ": ", e.what());
  }
  if (bound) {
    std::string last = s.get(zmq::sockopt::last_endpoint);
    const std::string prefix = "tcp://";
    if (last.compare(0, prefix.size(), prefix) == 0) last = last.substr(prefix.size());
    *bound = last;
  }
  return s;
}

void sendFrames(zmq::socket_t& socket, const Frames& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    socket.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore
                                                                : zmq::send_flags::none);
}

std::optional<Frames> recvFrames(zmq::socket_t& socket, std::chrono::milliseconds timeout,
                                 uint64_t* dropped) {
  if (!readable(socket, timeout)) return std::nullopt;
  zmq::message_t first;
  if (!socket.recv(first, zmq::recv_flags::dontwait)) return std::nullopt;
  std::vector<zmq::message_t> parts;
  if (!rest(socket, first, &parts, dropped, kMaxCoordinationFrames)) return std::nullopt;
  Frames out;
  for (auto& p : parts) out.push_back(p.to_string());
  return out;
}

void sendRouted(zmq::socket_t& socket, const std::string& routing_id, const Frames& frames) {
  socket.send(zmq::buffer(routing_id), zmq::send_flags::sndmore);
  sendFrames(socket, frames);
}

std::optional<Routed> recvRouted(zmq::socket_t& socket, std::chrono::milliseconds timeout,
                                 uint64_t* dropped) {
  if (!readable(socket, timeout)) return std::nullopt;
  zmq::message_t first;
  if (!socket.recv(first, zmq::recv_flags::dontwait)) return std::nullopt;
  std::vector<zmq::message_t> parts;
  if (!rest(socket, first, &parts, dropped, kMaxCoordinationFrames + 1)) return std::nullopt;
  if (parts.size() < 2) {
    if (dropped) ++*dropped;
    return std::nullopt;
  }
  Routed r;
  r.routing_id = parts[0].to_string();
  const char* user = parts[1].gets("User-Id");
  r.user_id = user ? user : "";
  const char* from = zmq_msg_gets(parts[1].handle(), "Peer-Address");
  r.peer_address = from ? from : "";
  r.source_fd = zmq_msg_get(parts[1].handle(), ZMQ_SRCFD);
  for (size_t i = 1; i < parts.size(); ++i) r.frames.push_back(parts[i].to_string());
  return r;
}

}  // namespace cairn
