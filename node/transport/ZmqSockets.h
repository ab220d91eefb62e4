// Small ZeroMQ helpers the transport's files share (ZmqTransport.cpp, ReversedLinks.cpp): binding
// while a port is still being released, polling through signals, queueing a message's first frame
// with a bounded wait, monitor endpoints, and the ThreadSanitizer hand-over of frames.
// No state; thread-safety is the caller's (each socket used by one thread at a time).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <zmq.hpp>

namespace cairn {

// Binds `socket`; on EADDRINUSE tries again for up to 2 s (a transport of this process closed a
// moment ago may still hold the port: ZeroMQ closes sockets in its I/O thread). Throws zmq::error_t.
void bindRetryingWhileInUse(zmq::socket_t& socket, const std::string& endpoint);
// Sets ZMQ_IPV6 on `socket` when `endpoint` names an IPv6 address in brackets
// ("tcp://[2001:db8::1]:7100", "[::]:7100"): libzmq reaches and binds IPv6 addresses only with it.
// IPv4 endpoints leave it off: with it on, a host name may resolve to an IPv6 address that a
// server bound on IPv4 does not take. Called before every connect and bind to a peer's address.
void allowIpv6For(zmq::socket_t& socket, const std::string& endpoint);

// zmq::poll that returns false instead of throwing when a signal interrupted it (EINTR).
bool pollOrInterrupted(std::vector<zmq::pollitem_t>& items, std::chrono::milliseconds timeout);

// Queues the first frame of a message on `socket`: at once, or once there is room, waiting at most
// `timeout` (false: it timed out). Once the first frame is queued, ZeroMQ queues the rest atomically.
bool queueFirstFrame(zmq::socket_t& socket, std::vector<zmq::message_t>& frames,
                     std::chrono::milliseconds timeout);

// ZMTP heartbeats: a PING every `interval`; no traffic for `timeout` closes the connection, and the
// peer is told (TTL) to drop its side too when our pings stop for as long. Nothing when `interval`
// is 0. (Not on a socket whose inbound carries bulk data to a slow reader: libzmq issue 3937,
// node/transport/Relay.h.)
void setZmtpHeartbeats(zmq::socket_t& socket, std::chrono::milliseconds interval,
                       std::chrono::milliseconds timeout);

// Copies of `frames` that share their bytes (zmq_msg_copy: reference-counted, nothing copied
// but frames small enough to live inside the message).
std::vector<zmq::message_t> shareFrames(std::vector<zmq::message_t>& frames);

// An inproc endpoint for a socket monitor, unique within the process.
std::string nextMonitorEndpoint(const std::string& name, const std::string& peer);

// Attaches a monitor for `events` to `socket` and returns the PAIR socket that receives them
// (before connect()/bind(), so no event is missed). InternalError naming `what` on failure.
zmq::socket_t monitorSocket(zmq::context_t& context, zmq::socket_t& socket, int events,
                            const std::string& name, const std::string& what);

// One pending monitor event (two frames: uint16 event + uint32 value, then the endpoint), without
// waiting; false when none is queued.
bool readMonitorEvent(zmq::socket_t& monitor, uint16_t* event, uint32_t* value);

// In a ThreadSanitizer build the sender releases and the receiver acquires each frame's bytes
// (libzmq's pipes are not instrumented); nothing in other builds.
void handOverFrames(std::vector<zmq::message_t>& frames);
void takeOverFrames(std::vector<zmq::message_t>& frames);

}  // namespace cairn
