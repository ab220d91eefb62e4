// VolunteerSockets: how a volunteer's sockets to the coordinator are made and written to, shared
// by VolunteerSession (join, wait, results) and VolunteerHeartbeats (heartbeats while training).
// Every volunteer socket is a DEALER, a CurveZMQ client of the coordinator's key from the invite
// (as node/volunteer/CoordinationSocket.h coordinationClient makes them), with ZMTP heartbeats so that a coordinator gone
// without closing its connection is noticed, and ZeroMQ's own reconnection.
// Ownership: returns owned sockets. Thread-safety: a socket belongs to one thread.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/protocol/Coordination.h"

namespace cairn {

// `immediate`: queue messages only on a connection whose handshake is done (ZMQ_IMMEDIATE), so
// that a send to a coordinator that is down fails at once instead of queueing (heartbeats and
// result uploads); without it a message waits for the connection (join).
// `send_high_water_mark` > 0: at most that many messages queued (ZMQ_SNDHWM).
zmq::socket_t volunteerSocket(zmq::context_t& context, const CurveKeyPair& own, const Invite& invite,
                              bool immediate, size_t max_message_bytes, int send_high_water_mark = 0);

// Never waits: false when the message cannot be queued now (no connection with `immediate`, or
// the high-water mark reached) or a signal interrupted the attempt (EINTR).
bool trySendFrames(zmq::socket_t& socket, const Frames& frames);

// Waits until the socket can take a message (a connection is up, with `immediate`), up to
// `timeout`, polling `stop` every 100 ms; then sends it. False when it could not be sent.
bool sendWhenConnected(zmq::socket_t& socket, const Frames& frames, std::chrono::milliseconds timeout,
                       const std::function<bool()>& stop);

// One reply of the coordinator on a background stream's socket (metrics, checkpoint uploads),
// waiting up to `wait`: the decoded message, or nullopt on timeout or when it is malformed (then
// logged as "<what>: the coordinator sent a malformed message (dropped): …").
std::optional<ToVolunteer> receiveReply(zmq::socket_t& socket, std::chrono::milliseconds wait,
                                        size_t max_message_bytes, const char* what);

}  // namespace cairn
