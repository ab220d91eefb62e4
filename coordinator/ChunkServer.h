// ChunkServer: the coordinator's side of served chunks (issue [K] part 2; messages in
// node/protocol/ChunkMessages.h). It holds the chunk table made at planning time — each chunk's
// file on the coordinator's machine, its size, its CRC-32 and the cluster it is dealt to — and
// answers a chunk_request with one piece of the file, or refuses it naming the chunk: a chunk not
// in the table, a chunk no deal gives the asker's cluster, an offset past the end, a file that
// changed size since planning.
// Which cluster may fetch a training chunk follows the deal (trainer/DealSampler.h; docs/OPERATIONS.md
// "Growing"): chunk k at position p of the listed chunks goes to cluster p % n in an epoch of n
// clusters, so it is served to cluster c when some entry of some deal the server follows gives it
// to c — in any epoch, since a request does not name one. The planned deal is followed from the
// start; a grown deal from the moment the coordinator proposes it (a running Root that takes it
// between steps asks for its new chunks at once, before the coordinator has heard it took it).
// Following only ever widens: a Root that took an offer may still need what it gave. The
// coordinator's ChunkService worker asks it (one thread, off the coordinator's loop: ChunkService.h);
// it reads with pread (trainer/data/FileReader.h), so a big shard never sits in memory.
// Ownership: owns the open files. Thread-safety: one thread (the ChunkService worker).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/NodeHeaders.h"
#include "core/NodeData.h"
#include "node/protocol/ChunkMessages.h"
#include "trainer/DealSampler.h"

namespace cairn {
class FileReader;
}

namespace cairn::coordinator {

struct ServedChunk {
  int64_t chunk = 0;
  std::string path;   // the shard file on the coordinator's machine
  uint64_t bytes = 0;
  std::string crc32;  // "crc32:xxxxxxxx" (trainer/data/ShardFiles.h shardChecksum)
  int64_t dealt = 0;  // its position among the listed chunks (data.chunk, or all): in an epoch of
                      // n clusters it is dealt to cluster dealt % n. -1: every cluster (a one-shard
                      // dataset, or a test chunk: every cluster evaluates on the whole test set);
                      // -2: not among data.chunk (no cluster)
};

class ChunkServer {
 public:
  // InternalError when a chunk id appears twice; BadInput when `deal` is not a valid deal.
  ChunkServer(std::vector<ServedChunk> chunks, const std::vector<DealEntry>& deal);
  ~ChunkServer();

  // Serves by `deal` too (a grown deal, offered or taken): every cluster it gives a chunk in any
  // epoch may fetch it. Never narrows what was served before. BadInput when `deal` is not valid.
  void follow(const std::vector<DealEntry>& deal);
  // The clusters chunk `chunk` is served to under the deals followed (sorted; {-1}: every cluster;
  // empty: none, or a chunk not in the table).
  std::vector<int> clustersOf(int64_t chunk) const;

  // The answer to `ask` from a volunteer of cluster `cluster`: a chunk_piece of at most
  // ask.length bytes from ask.offset, or a chunk_refused whose reason names the chunk.
  Frames answer(const ChunkRequest& ask, int cluster);
  uint64_t piecesServed() const { return pieces_; }
  uint64_t refused() const { return refused_; }

 private:
  Frames refuse(int64_t chunk, const std::string& reason);

  std::map<int64_t, ServedChunk> chunks_;
  std::set<int> counts_;           // every number of clusters some followed deal has an epoch of
  std::vector<DealEntry> shown_;   // the longest deal followed, for refusals
  std::map<int64_t, std::unique_ptr<FileReader>> open_;  // opened on first request
  uint64_t pieces_ = 0, refused_ = 0;
};

// data.source "coordinator": writes the chunk table of the job's data (each shard's file name,
// bytes, samples and CRC-32 — this reads every shard once) into job.data.options["shards"], so that
// every Root knows the sample counts without the data, and with data.test_location the test set's
// into ["test_shards"] (chunk ids after the training chunks'); other jobs are left as they are.
// Planning (RunAssembly) calls it before job.json is written.
void addServedChunkTable(JobSpec& job);

// Chunk `chunk`'s position among data.chunk's listed chunks (all when empty) of a `chunks`-row
// table, which the deal deals round robin as trainer/Sampler.h does; -1 for a one-row table
// (every cluster cuts that one file) and -2 for a chunk not listed.
int64_t dealtPosition(int64_t chunk, const std::vector<int64_t>& listed, int64_t chunks);
// The cluster that chunk is dealt to in an epoch of `clusters` clusters (-1, -2 as above).
int dealtCluster(int64_t chunk, const std::vector<int64_t>& listed, int64_t chunks, int clusters);

// The table a ChunkServer serves for the planned `job` (data.shards and data.test_shards written
// by addServedChunkTable): each training chunk with its position in the deal (dealtPosition),
// every test chunk to every cluster (-1); paths as the coordinator reads them.
std::vector<ServedChunk> servedChunks(const JobSpec& job);

// Answers one chunk_request (`frames`) from the member `member` (nullopt: a key that is not a
// member), making `*server` from the planned run in `out` on first use and having it follow every
// deal of `deals` (the run's deal first, then a growth proposal's: Growth.h servedDeals); the
// asker's cluster comes from `nodes` (its node.json, parsed once per version). Never throws for
// what a volunteer sent: malformed, not a member, not planned yet, are chunk_refused / rejected.
Frames serveChunkRequest(std::unique_ptr<ChunkServer>* server, NodeHeaders& nodes, const std::string& out,
                         const Frames& frames, const std::optional<std::string>& member,
                         const std::vector<std::vector<DealEntry>>& deals);

}  // namespace cairn::coordinator
