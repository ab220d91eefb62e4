// RelayedLinks' per-relay connection and per-peer link state (node/transport/RelayedLinks.h).
// Internal to RelayedLinks: RelayedLinks.cpp (the senders' side) and RelayedLinksDrain.cpp (the
// receiving thread's side) both use them. Which lock guards which field is said at the field.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "node/transport/RelaySeal.h"
#include "node/transport/RelayedLinks.h"

namespace cairn {

struct RelayedLinks::Connection {
  std::string endpoint, key;
  std::mutex send_mutex;  // send_socket
  zmq::socket_t send_socket, send_monitor;        // the senders'; its monitor: receiving thread
  zmq::socket_t receive_socket, receive_monitor;  // the receiving thread's
  bool connected = false;  // receive_socket's handshake completed (receiving thread)
  bool send_up = false;    // send_socket's handshake completed (receiving thread)
  bool refused = false, send_refused = false;
  std::chrono::steady_clock::time_point refused_at, send_refused_at, attached_at;
  std::set<std::string> present;  // the relay's last presence (receiving thread)
};

struct RelayedLinks::Link {
  Link(const CurveKeyPair& own, const std::string& key)
      : peer_key(key), sealer(own, key), opener(own, key), control_out(own, key), control_in(own, key) {}
  Connection* connection = nullptr;  // under RelayedLinks::mutex_
  PeerLiveness liveness;             // under RelayedLinks::mutex_
  // Under RelayedLinks::mutex_: the peer was named by a presence of `connection`'s relay since the
  // link moved there or our connection to it was made again, and since when that is being waited for.
  bool seen_here = false;
  std::chrono::steady_clock::time_point here_since = std::chrono::steady_clock::now();
  std::string receiver_key;  // under RelayedLinks::mutex_: a new peer key for the receiving side
  // Sender side, under `state`: sealing and sending one message is one step under it.
  std::mutex state;
  // Notified under `state` when the window may have opened (acknowledgements taken, a resend
  // carried out, the unacknowledged dropped): a sender waiting for room wakes then, not later.
  std::condition_variable room;
  std::string peer_key;
  LinkSealer sealer;
  // Sent and not acknowledged: sequence → the message's sealed frames (shared with what was sent,
  // not copied), sent again as they are; resealed in a new session when the peer restarted.
  std::deque<std::pair<uint64_t, std::vector<zmq::message_t>>> unacked;
  uint64_t next_sequence = 0;  // of the sealer's session
  std::optional<uint64_t> resend_from;  // a resend not carried out yet
  uint64_t unacked_bytes = 0;
  std::chrono::steady_clock::time_point progress_at = std::chrono::steady_clock::now();
  int silent_resends = 0;  // resends after silence since the last acknowledgement
  // Receiver side: the receiving thread's.
  LinkOpener opener;
  ControlSealer control_out;  // acknowledgements and requests to resend
  ControlOpener control_in;   // the peer's
  bool ack_due = false;
  uint64_t asked_session = 0, asked_next = 0;
  std::chrono::steady_clock::time_point asked_at;
};

}  // namespace cairn
