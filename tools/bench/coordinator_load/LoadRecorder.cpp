#include "tools/bench/coordinator_load/LoadRecorder.h"

#include <iostream>

namespace cairn::bench::load {

const char* msgName(Msg m) {
  switch (m) {
    case Msg::kProbe:
      return "bandwidth";
    case Msg::kJoin:
      return "join";
    case Msg::kHeartbeat:
      return "heartbeat";
    case Msg::kMetrics:
      return "metrics";
    case Msg::kCheckpoint:
      return "checkpoint";
    case Msg::kChunk:
      return "chunk_request";
    case Msg::kEcho:
      return "echo";
  }
  return "?";
}

void LoadRecorder::problem(const std::string& what) {
  // Only the first few of each thread are printed: thousands of volunteers repeat the same one.
  if (++problems_ <= 5) std::cerr << "coordinator_load: " << what << "\n";
}

}  // namespace cairn::bench::load
