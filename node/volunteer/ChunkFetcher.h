// ChunkFetcher: a Root's fetching of the data chunks its cluster trains on from the coordinator
// (issue [K] part 2; messages node/protocol/ChunkMessages.h, server coordinator/ChunkServer.h).
// Given the chunks in the order the sampler first needs them, its own thread fetches them ahead
// of need (and chunks add()ed later after them: a grown deal taken mid-run), piece by piece, over its own DEALER to the coordinator (ZMQ_IMMEDIATE, a timeout on
// every answer, retries with backoff): into <cache_dir>/<chunk>-<file>.part, then checks the
// CRC-32 against the chunk table's and renames the file into place. A mismatch deletes the file
// and fetches it again, up to `attempts` times, then refuses the chunk naming it; so a file a
// reader can see under its final name has always matched its checksum. The cache is bounded:
// the thread starts a chunk only when it fits beside the chunks fetched and not yet released
// (.part files included), so the bound holds on disk at every moment.
//
// The trainer asks ready(chunk) before reading it (waiting, with a timeout, only when the fetch
// started ahead has not finished) and release(chunk) once it is done with it for now: every use
// of a chunk in `order` is one ready() and one release(), in that order (a chunk needed again is
// fetched again after its release).
// Ownership: owns its socket, thread and the files in cache_dir it made. Thread-safety: ready(),
// release(), stats() from any thread; the socket only on the fetch thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "core/CurveKeys.h"
#include "node/protocol/Coordination.h"

namespace cairn {

struct FetchedChunk {
  int64_t chunk = 0;
  std::string file;   // the shard's file name (its last path component names the cached file)
  uint64_t bytes = 0;
  std::string crc32;  // "crc32:xxxxxxxx"
};

struct ChunkFetchOptions {
  std::string cache_dir;
  uint64_t cache_bytes = uint64_t(1) << 30;
  uint64_t piece_bytes = uint64_t(4) << 20;
  std::chrono::milliseconds answer_timeout{10000};  // per piece, before asking again
  int attempts = 4;                                 // tries per piece, and fetches per chunk
  std::chrono::milliseconds backoff{250};           // doubled after every failed try
  size_t max_message_bytes = size_t(32) << 20;
};

struct ChunkFetchStats {
  uint64_t fetched = 0;        // chunks verified and renamed into place
  uint64_t refetched = 0;      // chunks fetched again after a checksum mismatch
  uint64_t retried = 0;        // pieces asked again after no answer
  uint64_t peak_cache_bytes = 0;
};

class ChunkFetcher {
 public:
  // `order`: the chunks in the order they are first needed (a chunk may come again after it was
  // released: the next epoch). BadInput when one chunk is larger than cache_bytes (naming both).
  ChunkFetcher(zmq::context_t& context, const CurveKeyPair& own, const Invite& invite,
               std::string name, std::vector<FetchedChunk> order, ChunkFetchOptions options);
  ~ChunkFetcher();
  ChunkFetcher(const ChunkFetcher&) = delete;
  ChunkFetcher& operator=(const ChunkFetcher&) = delete;

  // Fetches `more` after the chunks given so far; chunks already among them are skipped. BadInput
  // (nothing added) when one is larger than cache_bytes. After a failed fetch (every later chunk
  // fails with its reason) the added chunks fail with that reason too.
  void add(std::vector<FetchedChunk> more);
  // The verified file of `chunk`, waiting up to `timeout` for its fetch. BadInput naming the chunk
  // (and the coordinator) when it was refused, failed, or is not there in time.
  std::string ready(int64_t chunk, std::chrono::milliseconds timeout);
  // Done with `chunk` for now: its file is removed and its room goes to the next chunks.
  void release(int64_t chunk);
  ChunkFetchStats stats() const;

 private:
  enum class State { kWaiting, kReady, kFailed };
  void run();
  // Fetches one chunk into place; "" on success, else why it failed (naming the chunk).
  std::string fetch(const FetchedChunk& c);
  std::string fetchOnce(const FetchedChunk& c, const std::string& part);
  std::string cachedPath(const FetchedChunk& c) const;

  zmq::socket_t socket_;
  std::string coordinator_;  // host:port, for messages
  std::string name_;
  std::vector<FetchedChunk> order_;  // under mutex_ (add() appends)
  std::string failed_;               // why the fetch thread stopped (under mutex_)
  ChunkFetchOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, State> state_;
  std::map<int64_t, std::string> failure_;
  std::map<int64_t, uint64_t> held_;  // chunks on disk (fetching or fetched) → their bytes
  uint64_t held_bytes_ = 0;
  ChunkFetchStats stats_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace cairn
