// CoordinationSocket: the ZeroMQ side of the coordination protocol (node/protocol/Coordination.h):
// CurveZMQ socket set-up for the three connections it uses, and sending / receiving one message
// (a list of frames) with a bound on frame count and a timeout.
//   volunteer → coordinator   DEALER, CURVE client of the coordinator's key (from the invite)
//   coordinator               ROUTER, CURVE server; a ZapAuthenticator(AnyKey) gives every
//                             message the sender's public key as its User-Id
//   reachability check        the coordinator's DEALER dials the volunteer's advertised address,
//                             a CURVE client of the volunteer's key; the volunteer's ROUTER there
//                             admits only the coordinator's key
// Ownership: the caller owns the sockets. Thread-safety: a socket belongs to one thread.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/protocol/Coordination.h"

namespace cairn {

constexpr size_t kMaxCoordinationFrames = 8;

// A CURVE client socket of `type` connecting to tcp://`address` whose server key is `server_key`.
zmq::socket_t coordinationClient(zmq::context_t& context, zmq::socket_type type,
                                 const CurveKeyPair& own, const std::string& server_key,
                                 const std::string& address, size_t max_message_bytes);
// A CURVE server ROUTER bound at tcp://`address` (a ZapAuthenticator must exist in `context`).
// Returns the bound "host:port" (the kernel's port when `address` ends in ":0" or ":*").
zmq::socket_t coordinationServer(zmq::context_t& context, const CurveKeyPair& own,
                                 const std::string& address, size_t max_message_bytes,
                                 std::string* bound);

// DEALER side: send / receive one message. recv returns nullopt on timeout; a message with more
// than kMaxCoordinationFrames frames is drained and dropped (nullopt, `*dropped` incremented).
void sendFrames(zmq::socket_t& socket, const Frames& frames);
std::optional<Frames> recvFrames(zmq::socket_t& socket, std::chrono::milliseconds timeout,
                                 uint64_t* dropped = nullptr);

// ROUTER side: the peer's routing id travels with the message, plus the connection's User-Id
// (ZAP: the sender's public key, or its name for keys the authenticator knows).
struct Routed {
  std::string routing_id;
  std::string user_id;
  std::string peer_address;  // the IP address the connection came from (empty when unknown)
  int source_fd = -1;        // the connection's file descriptor (ZMQ_SRCFD; -1 when unknown)
  Frames frames;
};
void sendRouted(zmq::socket_t& socket, const std::string& routing_id, const Frames& frames);
std::optional<Routed> recvRouted(zmq::socket_t& socket, std::chrono::milliseconds timeout,
                                 uint64_t* dropped = nullptr);

}  // namespace cairn
