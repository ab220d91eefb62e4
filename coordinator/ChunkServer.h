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
#include <optional>
#include <string>
#include <vector>

#include "core/NodeData.h"
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
  int cluster = 0;    // the cluster it is dealt to; -1: every cluster (a one-shard dataset, or a
                      // test chunk: every cluster evaluates on the whole test set)
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

// data.source "coordinator": writes the chunk table of the job's data (each shard's file name,
// bytes, samples and CRC-32 — this reads every shard once) into job.data.options["shards"], so that
// every Root knows the sample counts without the data, and with data.test_location the test set's
// into ["test_shards"] (chunk ids after the training chunks'); other jobs are left as they are.
// Planning (RunAssembly) calls it before job.json is written.
void addServedChunkTable(JobSpec& job);

// The cluster chunk `chunk` of a `chunks`-row table is dealt to: data.chunk's listed chunks (all
// when empty) round robin, as trainer/Sampler.h deals them; -1 for a one-row table (every
// cluster cuts that one file) and -2 for a chunk not listed.
int dealtCluster(int64_t chunk, const std::vector<int64_t>& listed, int64_t chunks, int clusters);

// The table a ChunkServer serves for the planned `job` (data.shards and data.test_shards written
// by addServedChunkTable) among `clusters` clusters: each training chunk dealt to its cluster
// (dealtCluster), every test chunk to every cluster (-1); paths as the coordinator reads them.
std::vector<ServedChunk> servedChunks(const JobSpec& job, int clusters);

// Answers one chunk_request (`frames`) from the member `member` (nullopt: a key that is not a
// member), making `*server` from the planned run in `out` on first use. Never throws for what a
// volunteer sent: malformed, not a member, not planned yet, are chunk_refused / rejected.
Frames serveChunkRequest(std::unique_ptr<ChunkServer>* server, const std::string& out,
                         const Frames& frames, const std::optional<std::string>& member);

}  // namespace cairn::coordinator
