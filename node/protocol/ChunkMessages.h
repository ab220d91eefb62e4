// ChunkMessages: the coordination messages by which a Root fetches the data chunks dealt to its
// cluster from the coordinator (issue [K] part 2, docs/PROTOCOL.md "Coordination"). They travel
// on the coordination connection (a CurveZMQ DEALER to the coordinator's ROUTER), in the envelope
// of node/protocol/Coordination.h (frame 0 a JSON header with "type" and "protocol", frames 1…
// attachments), but on a DEALER of their own (node/volunteer/ChunkFetcher.h), never the volunteer session's.
//
//   volunteer → coordinator
//     chunk_request {name, chunk, offset, length}   bytes [offset, offset + length) of chunk
//                                                   `chunk`; length 1…kMaxChunkPieceBytes
//   coordinator → volunteer
//     chunk_piece   {chunk, offset, total} + 1 attachment   the bytes from `offset` (fewer than
//                                                   asked at the chunk's end); `total`: the
//                                                   chunk's size
//     chunk_refused {chunk, reason}                 not served (a chunk of another cluster, an
//                                                   unknown chunk, an offset out of range)
//
// A chunk is served in pieces so that a shard of any size never needs one giant message.
// Decoding never throws: a malformed message yields nullopt and the reason (type, key, expected).
// Ownership: plain values. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "node/protocol/Coordination.h"

namespace cairn {

constexpr uint64_t kMaxChunkPieceBytes = uint64_t(16) << 20;  // one piece's attachment, at most

struct ChunkRequest {
  std::string name;  // the asking volunteer's node name (the coordinator checks its key)
  int64_t chunk = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
struct ChunkPiece {
  int64_t chunk = 0;
  uint64_t offset = 0;
  uint64_t total = 0;  // the chunk's size in bytes
  std::string bytes;
};
struct ChunkRefused {
  int64_t chunk = 0;
  std::string reason;  // names the chunk
};
using ChunkReply = std::variant<ChunkPiece, ChunkRefused>;

Frames encode(const ChunkRequest& m);
Frames encode(const ChunkPiece& m);
Frames encode(const ChunkRefused& m);

// True when frame 0 is a JSON header whose "type" is "chunk_request" (the coordinator routes such
// messages to its ChunkServer before the other coordination messages are decoded).
bool isChunkRequest(const Frames& frames);
std::optional<ChunkRequest> decodeChunkRequest(const Frames& frames, std::string* why);
std::optional<ChunkReply> decodeChunkReply(const Frames& frames, std::string* why);

}  // namespace cairn
