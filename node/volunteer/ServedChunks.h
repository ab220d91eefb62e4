// ServedChunks: the ChunkSource (trainer/data/ServedDataset.h) of a volunteer's Root whose job
// has data.source "coordinator" (issue [K] part 2). start() makes a ChunkFetcher
// (node/volunteer/ChunkFetcher.h) with its own ZeroMQ context and DEALER to the coordinator, under the
// volunteer's identity key (the coordinator answers only a member and only with its cluster's
// chunks), fetching into <workdir>/chunks (emptied first); ready() waits for a chunk's verified
// file. A second start() (the stage run again in-process) keeps the first one's fetcher; add()
// (a grown deal taken mid-run) hands the fetcher more chunks.
// Ownership: owns the context and the fetcher. Thread-safety: start() and ready() from the Root's
// trainer thread; the fetcher's own thread does the fetching.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/volunteer/ChunkFetcher.h"
#include "node/protocol/Coordination.h"
#include "trainer/data/ServedDataset.h"

namespace cairn {

class ServedChunks : public ChunkSource {
 public:
  // `wait`: how long ready() waits for a chunk not yet fetched before the run ends naming it.
  ServedChunks(Invite invite, CurveKeyPair identity, std::string name, std::string cache_dir,
               std::chrono::milliseconds wait = std::chrono::minutes(10));
  ~ServedChunks() override;
  void start(const std::vector<ServedShard>& order, uint64_t cache_bytes) override;
  void add(const std::vector<ServedShard>& more) override;
  std::string ready(int64_t chunk) override;

 private:
  Invite invite_;
  CurveKeyPair identity_;
  std::string name_, cache_dir_;
  std::chrono::milliseconds wait_;
  zmq::context_t context_;
  std::unique_ptr<ChunkFetcher> fetcher_;
};

}  // namespace cairn
