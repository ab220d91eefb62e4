// CollectiveNotices: the one place that defines the control messages of a collective group
// (docs/PROTOCOL.md "Collective messages", docs/COLLECTIVES.md "Timeouts and lost peers"), with
// one encode and one validating decode per message. They travel like the group's chunks (kind
// kCollective, tag "coll:<group id>", step = the operation's sequence number) and are told from
// chunks by a reserved microbatch value; they carry no tensor and name one member in `text`:
//   abort       2^64−1  an operation failed because `lost` was lost; the receiver fails too
//   keep-alive  2^64−2  the sender is alive inside operation `step`, waiting for `waiting_for`
//   leave       2^64−3  `leaver` left the group (sent by the leaver, or forwarded by a member
//                       whose operation failed on it)
// Decoding checks every header field (kind, tag, microbatch, no tensors, a non-empty member name);
// whether the names are members is the group's business (CollectiveChannel).
//
// Ownership: plain values. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "node/transport/WireCodec.h"

namespace cairn {

constexpr const char* kCollectiveTagPrefix = "coll:";
// Reserved microbatch values of the notices; every smaller value is a chunk's index.
constexpr uint64_t kAbortIndex = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kKeepAliveIndex = kAbortIndex - 1;
constexpr uint64_t kLeaveIndex = kAbortIndex - 2;

// "coll:" + group id: the tag of a group's chunks and notices.
std::string collectiveTag(const std::string& group_id);

enum class CollectiveMessageType { kChunk, kAbort, kKeepAlive, kLeave };
// By the microbatch value alone (no validation): what a kCollective message claims to be.
CollectiveMessageType collectiveMessageType(const Message& m);

struct AbortNotice {
  std::string sender;
  std::string tag;  // collectiveTag(group id)
  uint64_t step = 0;
  std::string lost;
};
struct KeepAliveNotice {
  std::string sender;
  std::string tag;
  uint64_t step = 0;
  std::string waiting_for;
};
struct LeaveNotice {
  std::string sender;
  std::string tag;
  uint64_t step = 0;
  std::string leaver;
};

Message encode(const AbortNotice& notice);
Message encode(const KeepAliveNotice& notice);
Message encode(const LeaveNotice& notice);
// The notice `m` holds, or nullopt with the reason in `*why` (when not null).
std::optional<AbortNotice> decodeAbort(const Message& m, std::string* why);
std::optional<KeepAliveNotice> decodeKeepAlive(const Message& m, std::string* why);
std::optional<LeaveNotice> decodeLeave(const Message& m, std::string* why);

}  // namespace cairn
