#include "node/volunteer/ServedChunks.h"

#include <filesystem>

#include "core/Error.h"

namespace cairn {

ServedChunks::ServedChunks(Invite invite, CurveKeyPair identity, std::string name, std::string cache_dir,
                           std::chrono::milliseconds wait)
    : invite_(std::move(invite)),
      identity_(std::move(identity)),
      name_(std::move(name)),
      cache_dir_(std::move(cache_dir)),
      wait_(wait) {}

ServedChunks::~ServedChunks() {
  fetcher_.reset();  // its socket before the context
}

void ServedChunks::start(const std::vector<ServedShard>& order, uint64_t cache_bytes) {
  // The stage run again in-process (a peer replaced, node/volunteer/VolunteerPeers.h) opens its data
  // again: the chunks fetched (and being fetched) for the first run serve it, and any its deal
  // gives it besides (a deal grown since) are fetched after them.
  if (fetcher_) return add(order);
  // What a run before this one left (a .part, a chunk of another job) goes first.
  std::error_code ec;
  std::filesystem::remove_all(cache_dir_, ec);
  std::vector<FetchedChunk> chunks;
  for (const ServedShard& s : order) chunks.push_back({s.chunk, s.file, s.bytes, s.crc32});
  ChunkFetchOptions options;
  options.cache_dir = cache_dir_;
  options.cache_bytes = cache_bytes;
  fetcher_ = std::make_unique<ChunkFetcher>(context_, identity_, invite_, name_, std::move(chunks), options);
}

void ServedChunks::add(const std::vector<ServedShard>& more) {
  if (!fetcher_) CAIRN_THROW(InternalError, "ServedChunks::add before start");
  std::vector<FetchedChunk> chunks;
  for (const ServedShard& s : more) chunks.push_back({s.chunk, s.file, s.bytes, s.crc32});
  fetcher_->add(std::move(chunks));
}

std::string ServedChunks::ready(int64_t chunk) {
  if (!fetcher_) CAIRN_THROW(InternalError, "ServedChunks::ready before start");
  return fetcher_->ready(chunk, wait_);
}

}  // namespace cairn
