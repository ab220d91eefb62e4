#include "node/transport/Transport.h"

namespace cairn {

const char* toString(SendStatus status) {
  switch (status) {
    case SendStatus::kSent:
      return "sent";
    case SendStatus::kTimedOut:
      return "timed out";
    case SendStatus::kUnknownPeer:
      return "unknown peer";
  }
  return "?";
}

const char* toString(PeerState state) {
  switch (state) {
    case PeerState::kUnknown:
      return "unknown";
    case PeerState::kConnected:
      return "connected";
    case PeerState::kDisconnected:
      return "disconnected";
  }
  return "?";
}

}  // namespace cairn
