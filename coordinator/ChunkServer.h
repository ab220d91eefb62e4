// ChunkServer: the coordinator's side of served chunks (issue [K] part 2; messages in
// node/protocol/ChunkMessages.h). It holds the chunk table made at planning time — each chunk's
// file on the coordinator's machine, its size, its CRC-32 and the cluster it is dealt to — and
// answers a chunk_request with one piece of the file, or refuses it naming the chunk: a chunk not
// in the table, a chunk dealt to another cluster than the asker's, an offset past the end, a file
// that changed size since planning. The coordinator's loop asks it (one thread); it reads with
// pread (trainer/data/FileReader.h), so a big shard never sits in memory.
// Ownership: owns the open files. Thread-safety: one thread (the coordinator's loop).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "node/protocol/ChunkMessages.h"

namespace cairn {
class FileReader;
}

namespace cairn::coordinator {

struct ServedChunk {
  int64_t chunk = 0;
  std::string path;   // the shard file on the coordinator's machine
  uint64_t bytes = 0;
  std::string crc32;  // "crc32:xxxxxxxx" (trainer/data/ShardFiles.h shardChecksum)
  int cluster = 0;    // the cluster it is dealt to
};

class ChunkServer {
 public:
  // InternalError when a chunk id appears twice.
  explicit ChunkServer(std::vector<ServedChunk> chunks);
  ~ChunkServer();

  // The answer to `ask` from a volunteer of cluster `cluster`: a chunk_piece of at most
  // ask.length bytes from ask.offset, or a chunk_refused whose reason names the chunk.
  Frames answer(const ChunkRequest& ask, int cluster);
  uint64_t piecesServed() const { return pieces_; }
  uint64_t refused() const { return refused_; }

 private:
  Frames refuse(int64_t chunk, const std::string& reason);

  std::map<int64_t, ServedChunk> chunks_;
  std::map<int64_t, std::unique_ptr<FileReader>> open_;  // opened on first request
  uint64_t pieces_ = 0, refused_ = 0;
};

}  // namespace cairn::coordinator
