#include "coordinator/ChunkServer.h"

#include <algorithm>
#include <filesystem>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/data/FileReader.h"

namespace cairn::coordinator {

ChunkServer::ChunkServer(std::vector<ServedChunk> chunks) {
  for (ServedChunk& c : chunks) {
    const int64_t id = c.chunk;
    if (!chunks_.emplace(id, std::move(c)).second)
      CAIRN_THROW(InternalError, "chunk table: chunk ", id, " appears twice");
  }
}

ChunkServer::~ChunkServer() = default;

Frames ChunkServer::refuse(int64_t chunk, const std::string& reason) {
  ++refused_;
  CAIRN_WARN("coordinator: refused a chunk request: ", reason);
  return encode(ChunkRefused{chunk, reason.substr(0, kMaxReasonBytes)});
}

Frames ChunkServer::answer(const ChunkRequest& ask, int cluster) {
  const std::string what = "chunk " + std::to_string(ask.chunk);
  auto it = chunks_.find(ask.chunk);
  if (it == chunks_.end()) return refuse(ask.chunk, what + " is not served by this coordinator");
  const ServedChunk& c = it->second;
  if (c.cluster != cluster)
    return refuse(ask.chunk, what + " is dealt to cluster " + std::to_string(c.cluster) + ", not to " +
                                 ask.name + "'s cluster " + std::to_string(cluster));
  if (ask.offset >= c.bytes)
    return refuse(ask.chunk, what + ": offset " + std::to_string(ask.offset) + " is past its end (" +
                                 std::to_string(c.bytes) + " bytes)");
  auto& reader = open_[ask.chunk];
  try {
    // Its size now, not when it was opened: a file replaced or grown since planning is refused.
    std::error_code ec;
    const uint64_t now = std::filesystem::file_size(c.path, ec);
    if (ec) CAIRN_THROW(BadInput, c.path, ": ", ec.message());
    if (!reader) reader = std::make_unique<FileReader>(c.path);
    if (now != c.bytes || reader->size() != c.bytes) {
      reader.reset();
      return refuse(ask.chunk, what + " (" + c.path + ") is " + std::to_string(now) +
                                   " bytes on the coordinator, " + std::to_string(c.bytes) +
                                   " when the run was planned: it changed");
    }
    const uint64_t length = std::min({ask.length, kMaxChunkPieceBytes, c.bytes - ask.offset});
    ChunkPiece piece{ask.chunk, ask.offset, c.bytes, {}};
    piece.bytes.resize(length);
    reader->read(ask.offset, length, piece.bytes.data(), "a served chunk's piece");
    ++pieces_;
    return encode(piece);
  } catch (const Error& e) {
    reader.reset();
    return refuse(ask.chunk, what + " cannot be read on the coordinator: " + e.what());
  }
}

}  // namespace cairn::coordinator
