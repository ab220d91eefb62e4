#include "node/volunteer/ChunkFetcher.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/Error.h"
#include "core/Log.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/VolunteerSockets.h"
#include "node/protocol/ChunkMessages.h"
#include "trainer/data/ShardFiles.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string label(const FetchedChunk& c) {
  return "chunk " + std::to_string(c.chunk) + " (" + fs::path(c.file).filename().string() + ")";
}

}  // namespace

ChunkFetcher::ChunkFetcher(zmq::context_t& context, const CurveKeyPair& own, const Invite& invite,
                           std::string name, std::vector<FetchedChunk> order, ChunkFetchOptions options)
    : socket_(volunteerSocket(context, own, invite, /*immediate=*/true, options.max_message_bytes)),
      coordinator_(invite.address()),
      name_(std::move(name)),
      order_(std::move(order)),
      options_(std::move(options)) {
  for (const FetchedChunk& c : order_)
    if (c.bytes > options_.cache_bytes)
      CAIRN_THROW(BadInput, "served data: ", label(c), " is ", c.bytes,
                  " bytes, more than the chunk cache holds (", options_.cache_bytes,
                  " bytes): raise the cache size");
  if (options_.piece_bytes == 0 || options_.piece_bytes > kMaxChunkPieceBytes)
    options_.piece_bytes = kMaxChunkPieceBytes;
  fs::create_directories(options_.cache_dir);
  thread_ = std::thread([this] { run(); });
}

ChunkFetcher::~ChunkFetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string ChunkFetcher::cachedPath(const FetchedChunk& c) const {
  return options_.cache_dir + "/" + std::to_string(c.chunk) + "-" + fs::path(c.file).filename().string();
}

void ChunkFetcher::run() {
  for (size_t i = 0;; ++i) {
    FetchedChunk c;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Every chunk given so far is fetched: wait for more (add) or the end.
      changed_.wait(lock, [&] { return stop_ || i < order_.size(); });
      if (stop_) return;
      c = order_[i];
      changed_.wait(lock, [&] {
        // A chunk needed again is fetched again once its previous use released it.
        return stop_ || (!held_.count(c.chunk) && held_bytes_ + c.bytes <= options_.cache_bytes);
      });
      if (stop_) return;
      held_[c.chunk] = c.bytes;
      held_bytes_ += c.bytes;
      stats_.peak_cache_bytes = std::max(stats_.peak_cache_bytes, held_bytes_);
      state_[c.chunk] = State::kWaiting;
    }
    const std::string why = fetch(c);
    std::lock_guard<std::mutex> lock(mutex_);
    if (why.empty()) {
      state_[c.chunk] = State::kReady;
      ++stats_.fetched;
    } else {
      CAIRN_ERROR("served data: ", why);
      held_bytes_ -= held_[c.chunk];
      held_.erase(c.chunk);
      // This chunk and every one after it fail with the reason: training cannot go past it.
      failed_ = why;
      for (size_t j = i; j < order_.size(); ++j) {
        if (state_[order_[j].chunk] == State::kReady) continue;
        state_[order_[j].chunk] = State::kFailed;
        failure_[order_[j].chunk] = j == i ? why : label(order_[j]) + " was not fetched: " + why;
      }
      changed_.notify_all();
      return;
    }
    changed_.notify_all();
  }
}

void ChunkFetcher::add(std::vector<FetchedChunk> more) {
  for (const FetchedChunk& c : more)
    if (c.bytes > options_.cache_bytes)
      CAIRN_THROW(BadInput, "served data: ", label(c), " is ", c.bytes,
                  " bytes, more than the chunk cache holds (", options_.cache_bytes,
                  " bytes): raise the cache size");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (FetchedChunk& c : more) {
      const bool known = std::any_of(order_.begin(), order_.end(),
                                     [&](const FetchedChunk& o) { return o.chunk == c.chunk; });
      if (known) continue;
      if (!failed_.empty()) {
        state_[c.chunk] = State::kFailed;
        failure_[c.chunk] = label(c) + " was not fetched: " + failed_;
      }
      order_.push_back(std::move(c));
    }
  }
  changed_.notify_all();
}

std::string ChunkFetcher::fetch(const FetchedChunk& c) {
  const std::string path = cachedPath(c), part = path + ".part";
  std::string last;
  for (int attempt = 1; attempt <= options_.attempts; ++attempt) {
    last = fetchOnce(c, part);
    if (!last.empty()) {
      std::error_code ec;
      fs::remove(part, ec);
      return last;  // no answer or refused: not worth fetching the same way again
    }
    const std::string got = shardChecksum(ShardInfo{part, 0, c.bytes});
    if (got == c.crc32) {
      fs::rename(part, path);
      return {};
    }
    fs::remove(part);
    last = label(c) + " fetched from the coordinator at " + coordinator_ + " has checksum " + got +
           ", the chunk table says " + c.crc32;
    CAIRN_WARN("served data: ", last, " (try ", attempt, " of ", options_.attempts, ")");
    std::lock_guard<std::mutex> lock(mutex_);
    if (attempt < options_.attempts) ++stats_.refetched;
  }
  return last + "; refused after " + std::to_string(options_.attempts) + " fetches";
}

std::string ChunkFetcher::fetchOnce(const FetchedChunk& c, const std::string& part) {
  std::ofstream out(part, std::ios::binary | std::ios::trunc);
  if (!out) return label(c) + ": cannot write " + part;
  uint64_t offset = 0;
  while (offset < c.bytes) {
    const ChunkRequest ask{name_, c.chunk, offset, std::min(options_.piece_bytes, c.bytes - offset)};
    milliseconds backoff = options_.backoff;
    std::optional<ChunkPiece> piece;
    for (int tries = 1; !piece; ++tries) {
      if (stop_) return label(c) + ": stopped";
      if (sendWhenConnected(socket_, encode(ask), options_.answer_timeout, [this] { return stop_.load(); })) {
        const auto deadline = Clock::now() + options_.answer_timeout;
        while (!piece && Clock::now() < deadline && !stop_) {
          const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
          const auto frames = recvFrames(socket_, std::min(left, milliseconds(100)));
          if (!frames) continue;
          std::string why;
          auto reply = decodeChunkReply(*frames, &why);
          if (!reply) {
            CAIRN_WARN("served data: dropped an answer from the coordinator: ", why);
          } else if (auto* refused = std::get_if<ChunkRefused>(&*reply)) {
            if (refused->chunk == c.chunk)
              return "the coordinator at " + coordinator_ + " refused " + label(c) + ": " + refused->reason;
          } else if (auto* p = std::get_if<ChunkPiece>(&*reply); p->chunk == c.chunk && p->offset == offset) {
            if (p->total != c.bytes)
              return label(c) + ": the coordinator at " + coordinator_ + " serves it with " +
                     std::to_string(p->total) + " bytes, the chunk table says " + std::to_string(c.bytes);
            piece = std::move(*p);
          }  // else a late answer to an earlier ask: dropped
        }
      }
      if (piece) break;
      if (tries >= options_.attempts)
        return label(c) + ": no answer from the coordinator at " + coordinator_ + " for bytes " +
               std::to_string(offset) + "+ after " + std::to_string(tries) + " tries of " +
               std::to_string(options_.answer_timeout.count()) + " ms";
      std::unique_lock<std::mutex> lock(mutex_);
      ++stats_.retried;
      changed_.wait_for(lock, backoff, [this] { return stop_.load(); });
      backoff *= 2;
    }
    out.write(piece->bytes.data(), std::streamsize(piece->bytes.size()));
    if (!out) return label(c) + ": cannot write " + part;
    offset += piece->bytes.size();
  }
  out.close();
  return out ? std::string() : label(c) + ": cannot write " + part;
}

std::string ChunkFetcher::ready(int64_t chunk, milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = std::find_if(order_.begin(), order_.end(),
                         [&](const FetchedChunk& c) { return c.chunk == chunk; });
  if (it == order_.end())
    CAIRN_THROW(BadInput, "served data: chunk ", chunk, " is not among the chunks of ", name_);
  const FetchedChunk c = *it;  // add() may move order_ while this waits
  const bool done = changed_.wait_for(lock, timeout, [&] {
    auto s = state_.find(chunk);
    return s != state_.end() && s->second != State::kWaiting;
  });
  if (done && state_[chunk] == State::kReady) return cachedPath(c);
  if (done) CAIRN_THROW(BadInput, "served data: ", failure_[chunk]);
  CAIRN_THROW(BadInput, "served data: ", label(c), " was not fetched from the coordinator at ",
              coordinator_, " within ", timeout.count() / 1000.0, " s");
}

void ChunkFetcher::release(int64_t chunk) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto h = held_.find(chunk);
  auto s = state_.find(chunk);
  if (h == held_.end() || s == state_.end() || s->second != State::kReady) return;
  auto it = std::find_if(order_.begin(), order_.end(),
                         [&](const FetchedChunk& c) { return c.chunk == chunk; });
  std::error_code ec;
  fs::remove(cachedPath(*it), ec);
  held_bytes_ -= h->second;
  held_.erase(h);
  state_.erase(s);
  changed_.notify_all();
}

ChunkFetchStats ChunkFetcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace cairn
