// SameHostLinks: what decides that two nodes talk over a same-host link (docs/PROTOCOL.md
// "Same-host links"; ZmqTransport.h): the user's directory of Unix-domain sockets, whether a tcp
// endpoint is on a loopback address (so on this host), and the socket that stands for it.
//
// Ownership: none. Thread-safety: free functions; sameHostDir touches the file system (mkdir).
#pragma once

#include <string>

namespace cairn {

// The directory for same-host links: `dir` (default /tmp/cairn-<uid>), created with mode 0700 when
// missing. Empty (with a warning naming the reason) when it is not a directory this user owns with
// mode 0700 (a symlink, another user's, open to group or others): nodes then talk over TCP only.
std::string sameHostDir(const std::string& dir = "");

// True for tcp://HOST:PORT endpoints whose HOST is a loopback name (core/NodeConfigs.h
// isLoopbackName).
bool isLoopbackTcpEndpoint(const std::string& endpoint);

// The same-host socket ipc://DIR/PORT standing for `tcp_endpoint`, or empty when `dir` is empty
// (same-host links off) or the endpoint is not tcp on a loopback address.
std::string sameHostSocket(const std::string& dir, const std::string& tcp_endpoint);

}  // namespace cairn
