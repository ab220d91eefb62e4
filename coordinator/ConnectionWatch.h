// ConnectionWatch: which volunteers' connections to the coordinator have all closed (docs/
// OPERATIONS.md "A lost volunteer is replaced by a spare"). A volunteer whose process ends — killed,
// crashed, its machine rebooted — closes every TCP connection it had to the coordinator at once (its
// kernel does); one that is frozen or cut off keeps them open and only falls silent. So a placed
// volunteer that had connections, has none left, and has sent nothing since for --gone-after-s is
// lost without waiting out --lost-after-s (Replacement.h findLost): a kill costs its cluster seconds,
// not the whole silence timeout. Evidence is the coordinator's own (its ROUTER's connections), never
// a peer's word: no volunteer can get another replaced.
// Each message read carries the file descriptor of the connection it came on (ZMQ_SRCFD) and its
// CURVE key (ZAP User-Id); the ROUTER's monitor reports each closed connection by descriptor
// (ZMQ_EVENT_DISCONNECTED). A key's open connections are those it has spoken on and that have not
// closed. A descriptor the kernel reuses for a new connection was closed first (libzmq reports the
// close before it closes the descriptor), and the coordinator reads monitor events before messages.
// Memory: one entry per member key that spoke (members are never forgotten either), and one per
// open connection it spoke on.
// Written by hand: bookkeeping of a few maps; ZeroMQ's ROUTER_NOTIFY (peer connect/disconnect by
// routing id) is a draft API that Debian's libzmq 4.3 does not build.
// Thread-safety: the coordinator's loop thread only.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <unordered_map>

namespace cairn::coordinator {

class ConnectionWatch {
 public:
  // A message from `key` read from connection `fd`. fd < 0 (unknown: not a TCP connection) is
  // ignored. The key is back: whatever closed before no longer counts.
  void heard(const std::string& key, int fd);
  // Connection `fd` closed at `now`. When it was the last open one a key had spoken on, that key is
  // gone since `now`.
  void closed(int fd, double now);
  // Since when every connection `key` spoke on has been closed, with nothing heard from it since;
  // nullopt while one is open, after it spoke again, or for a key never heard.
  std::optional<double> goneSince(const std::string& key) const;

  size_t trackedKeys() const { return keys_.size(); }
  size_t openConnections() const { return fd_key_.size(); }

 private:
  struct Seen {
    std::set<int> open;                 // connections it spoke on, not closed
    std::optional<double> gone_since;   // the last of them closed, nothing heard since
  };
  std::unordered_map<int, std::string> fd_key_;  // an open connection → the key that spoke on it
  std::unordered_map<std::string, Seen> keys_;
};

}  // namespace cairn::coordinator
