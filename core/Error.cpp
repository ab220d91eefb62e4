#include "core/Error.h"

namespace cairn {

Error::Error(ErrorKind kind, std::string message, const char* file, int line)
    : std::runtime_error(std::move(message)), kind_(kind) {
  if (file && *file) where_ = std::string(file) + ":" + std::to_string(line);
}

const char* toString(LossCause cause) {
  switch (cause) {
    case LossCause::kSilent:
      return "silent";
    case LossCause::kDisconnected:
      return "disconnected";
    case LossCause::kLeft:
      return "left";
    case LossCause::kRestarted:
      return "restarted";
    case LossCause::kAborted:
      return "aborted";
  }
  return "unknown";
}

int Error::exitCode() const {
  switch (kind_) {
    case ErrorKind::kBadInput:
      return 2;
    case ErrorKind::kPeerLost:
      return 3;
    case ErrorKind::kInternal:
      return 1;
  }
  return 1;
}

}  // namespace cairn
