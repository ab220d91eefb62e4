// Served chunks, the Root's side (issue [K] part 2): node/protocol/ChunkMessages.h and
// node/volunteer/ChunkFetcher.h against a fake coordinator (a CurveZMQ ROUTER on its own thread serving
// chunk bytes the test made):
//   - encode → decode round-trips; every malformed field is refused with a reason naming it;
//   - every chunk arrives byte for byte (checked against the test's own bytes and zlib's CRC-32);
//     a corrupted piece makes the chunk fetched again, and no file under a chunk's final name
//     ever differs from its bytes (the fake coordinator looks at the cache on every request);
//   - the cache bound holds on disk at every request the coordinator sees;
//   - a chunk always corrupted, a chunk the coordinator refuses, a coordinator that does not
//     answer: ready() throws BadInput naming the chunk; a chunk larger than the cache is refused.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/Error.h"
#include "node/volunteer/ChunkFetcher.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/protocol/ChunkMessages.h"
#include "tests/common/LoopbackPorts.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;

std::string crcText(const std::string& bytes) {
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), uInt(bytes.size()));
  char text[16];
  std::snprintf(text, sizeof text, "%08lx", static_cast<unsigned long>(crc));
  return std::string("crc32:") + text;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string why(const Frames& f, bool request) {
  std::string reason;
  if (request) EXPECT_FALSE(decodeChunkRequest(f, &reason).has_value()) << f[0];
  else EXPECT_FALSE(decodeChunkReply(f, &reason).has_value()) << f[0];
  return reason;
}

Frames patched(const Frames& f, const json& patch) {
  json h = json::parse(f[0]);
  h.merge_patch(patch);
  Frames out = f;
  out[0] = h.dump();
  return out;
}

TEST(ChunkMessages, RoundTripAndMalformedFieldsAreRefusedWithTheirReason) {
  const Frames ask = encode(ChunkRequest{"node_3", 7, 4096, 1024});
  ASSERT_TRUE(isChunkRequest(ask));
  std::string reason;
  const auto r = decodeChunkRequest(ask, &reason);
  ASSERT_TRUE(r.has_value()) << reason;
  EXPECT_EQ(r->name, "node_3");
  EXPECT_EQ(r->chunk, 7);
  EXPECT_EQ(r->offset, 4096u);
  EXPECT_EQ(r->length, 1024u);
  const auto piece = decodeChunkReply(encode(ChunkPiece{7, 10, 13, "abc"}), &reason);
  ASSERT_TRUE(piece && std::holds_alternative<ChunkPiece>(*piece)) << reason;
  EXPECT_EQ(std::get<ChunkPiece>(*piece).bytes, "abc");
  EXPECT_EQ(std::get<ChunkPiece>(*piece).total, 13u);
  const auto refused = decodeChunkReply(encode(ChunkRefused{2, "chunk 2 is dealt to cluster 1"}), &reason);
  ASSERT_TRUE(refused && std::holds_alternative<ChunkRefused>(*refused)) << reason;
  EXPECT_EQ(std::get<ChunkRefused>(*refused).reason, "chunk 2 is dealt to cluster 1");

  EXPECT_EQ(why(patched(ask, {{"length", 0}}), true),
            "chunk_request: \"length\" must be 1 to 16777216 bytes (got 0)");
  EXPECT_EQ(why(patched(ask, {{"length", 20 << 20}}), true),
            "chunk_request: \"length\" must be 1 to 16777216 bytes (got 20971520)");
  EXPECT_EQ(why(patched(ask, {{"chunk", -1}}), true), "chunk_request: \"chunk\" must be a non-negative integer");
  EXPECT_EQ(why(patched(ask, {{"offset", "0"}}), true), "chunk_request: \"offset\" must be a non-negative integer");
  EXPECT_EQ(why(patched(ask, {{"name", ""}}), true), "chunk_request: \"name\" must be a string of 1 to 128 bytes");
  EXPECT_EQ(why(patched(ask, {{"protocol", 9}}), true), "\"protocol\" must be 1 (a different cairn version?)");
  Frames with_attachment = ask;
  with_attachment.push_back("x");
  EXPECT_EQ(why(with_attachment, true), "chunk_request: 1 attachments, expected 0");
  EXPECT_EQ(why({"[1]"}, true), "header is not a JSON object");
  EXPECT_FALSE(isChunkRequest(encode(ChunkRefused{1, "no"})));

  const Frames good_piece = encode(ChunkPiece{1, 10, 13, "abc"});
  EXPECT_EQ(why(encode(ChunkPiece{1, 11, 13, "abc"}), false),
            "chunk_piece: 3 bytes at offset 11 do not fit a chunk of 13 bytes (a piece holds 1 to "
            "16777216 bytes)");
  EXPECT_EQ(why(encode(ChunkPiece{1, 0, 13, ""}), false),
            "chunk_piece: 0 bytes at offset 0 do not fit a chunk of 13 bytes (a piece holds 1 to "
            "16777216 bytes)");
  EXPECT_EQ(why({good_piece[0]}, false), "chunk_piece: 0 attachments, expected 1");
  EXPECT_EQ(why(patched(good_piece, {{"total", nullptr}}), false),
            "chunk_piece: \"total\" must be a non-negative integer");
  EXPECT_EQ(why(patched(encode(ChunkRefused{1, "x"}), {{"reason", std::string(600, 'r')}}), false),
            "chunk_refused: \"reason\" must be a string of 1 to 512 bytes");
}

// A fake coordinator serving `chunks` (id → bytes) from its own thread. It refuses ids in
// `refused`, corrupts the first piece of chunk `corrupt` the first `corrupt_times` times it is
// asked, and on every request checks the cache folder: total bytes ≤ `bound`, and every file under
// a final name holds exactly its chunk's bytes.
struct FakeChunkCoordinator {
  CurveKeyPair keys = generateCurveKeyPair();
  zmq::context_t context;
  ZapAuthenticator zap{context, ZapAuthenticator::AnyKey{}};
  std::string bound_address;
  zmq::socket_t router{coordinationServer(context, keys, "127.0.0.1:0", 64 << 20, &bound_address)};
  std::map<int64_t, std::string> chunks;
  std::set<int64_t> refused;
  int64_t corrupt = -1;
  int corrupt_times = 0;
  std::string cache_dir;
  uint64_t bound = 0;
  std::atomic<uint64_t> max_seen{0};
  std::atomic<int> bad_final_files{0};
  std::atomic<int> requests{0};
  std::atomic<bool> stop{false};
  std::thread thread;

  void start() { thread = std::thread([this] { serve(); }); }
  ~FakeChunkCoordinator() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  Invite invite() const {
    const auto colon = bound_address.rfind(':');
    return Invite{bound_address.substr(0, colon), std::stoi(bound_address.substr(colon + 1)),
                  keys.public_key, "00112233445566778899aabbccddeeff"};
  }
  void inspectCache() {
    uint64_t total = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(cache_dir, ec)) {
      // The fetcher renames and removes files meanwhile (on its own thread, and release() on the
      // test's): one gone between the listing and a look at it is skipped, not a crash (a slow
      // run under ThreadSanitizer once ended here in file_size's filesystem_error).
      std::error_code gone;
      const uintmax_t size = e.file_size(gone);
      if (gone) continue;
      total += size;
      const std::string name = e.path().filename().string();
      if (name.size() > 5 && name.substr(name.size() - 5) == ".part") continue;
      const int64_t id = std::stoll(name.substr(0, name.find('-')));
      const std::string bytes = readAll(e.path().string());
      if (bytes != chunks.at(id) && fs::exists(e.path())) ++bad_final_files;
    }
    max_seen = std::max<uint64_t>(max_seen, total);
  }
  void serve() {
    while (!stop) {
      auto in = recvRouted(router, 50ms);
      if (!in) continue;
      ++requests;
      inspectCache();
      std::string reason;
      const auto ask = decodeChunkRequest(in->frames, &reason);
      if (!ask) throw std::runtime_error("the fake coordinator got a bad request: " + reason);
      if (refused.count(ask->chunk) || !chunks.count(ask->chunk)) {
        sendRouted(router, in->routing_id,
                   encode(ChunkRefused{ask->chunk, "chunk " + std::to_string(ask->chunk) +
                                                       " is dealt to cluster 1, not to cluster 0"}));
        continue;
      }
      const std::string& bytes = chunks.at(ask->chunk);
      ChunkPiece p{ask->chunk, ask->offset, bytes.size(),
                   bytes.substr(ask->offset, std::min<uint64_t>(ask->length, bytes.size() - ask->offset))};
      if (ask->chunk == corrupt && ask->offset == 0 && corrupt_times > 0) {
        --corrupt_times;
        p.bytes[p.bytes.size() / 2] ^= 0x40;
      }
      sendRouted(router, in->routing_id, encode(p));
    }
  }
};

struct CacheDir {
  std::string path = (fs::temp_directory_path() /
                      ("cairn_chunks_" + std::to_string(::getpid()) + "_" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                         .string();
  CacheDir() { fs::remove_all(path); }
  ~CacheDir() { fs::remove_all(path); }
};

std::string pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = char(x >> 24);
  }
  return s;
}

std::vector<FetchedChunk> table(const FakeChunkCoordinator& f, const std::vector<int64_t>& order) {
  std::vector<FetchedChunk> out;
  for (int64_t id : order) {
    const std::string& bytes = f.chunks.count(id) ? f.chunks.at(id) : f.chunks.begin()->second;
    out.push_back({id, "/data/train_" + std::to_string(id) + ".bin", bytes.size(), crcText(bytes)});
  }
  return out;
}

ChunkFetchOptions options(const std::string& dir, uint64_t cache) {
  ChunkFetchOptions o;
  o.cache_dir = dir;
  o.cache_bytes = cache;
  o.piece_bytes = 64 << 10;
  o.answer_timeout = 2000ms;
  o.attempts = 3;
  o.backoff = 50ms;
  return o;
}

TEST(ChunkFetcher, ChunksArriveWholeACorruptedPieceIsFetchedAgainAndTheCacheBoundHolds) {
  CacheDir dir;
  FakeChunkCoordinator f;
  f.chunks = {{4, pattern(300000, 4)}, {0, pattern(500001, 0)}, {2, pattern(200000, 2)}};
  f.corrupt = 0;
  f.corrupt_times = 1;
  f.cache_dir = dir.path;
  f.bound = 800001;
  f.start();
  zmq::context_t context;
  // Epoch 0 needs 4, 0, 2; epoch 1 again 4, 0, 2 (fetched again after release).
  ChunkFetcher fetcher(context, generateCurveKeyPair(), f.invite(), "node_7",
                       table(f, {4, 0, 2, 4, 0, 2}), options(dir.path, f.bound));
  for (int epoch = 0; epoch < 2; ++epoch)
    for (int64_t id : {4, 0, 2}) {
      const std::string path = fetcher.ready(id, 20s);
      EXPECT_EQ(readAll(path), f.chunks.at(id)) << "chunk " << id << " epoch " << epoch;
      fetcher.release(id);
      EXPECT_FALSE(fs::exists(path));
    }
  const ChunkFetchStats s = fetcher.stats();
  EXPECT_EQ(s.fetched, 6u);
  EXPECT_EQ(s.refetched, 1u) << "chunk 0's first fetch was corrupted";
  EXPECT_LE(s.peak_cache_bytes, f.bound);
  EXPECT_GT(f.requests.load(), 2 * (300000 + 500001 + 200000) / (64 << 10));
  EXPECT_LE(f.max_seen.load(), f.bound) << "the cache held more than its bound on disk";
  EXPECT_EQ(f.bad_final_files.load(), 0) << "a corrupted chunk was visible under its final name";
}

// A running Root that takes a grown deal (trainer/DealChange.h) hands the fetcher the chunks the
// new deal gives its cluster besides: they are fetched after the first ones (a chunk already
// among them is not fetched twice), even once the first ones are all done and the thread waits.
TEST(ChunkFetcher, ChunksAddedLaterAreFetchedAfterTheFirstOnes) {
  CacheDir dir;
  FakeChunkCoordinator f;
  f.chunks = {{0, pattern(70000, 0)}, {1, pattern(90000, 1)}, {3, pattern(50000, 3)}};
  f.cache_dir = dir.path;
  f.start();
  zmq::context_t context;
  ChunkFetcher fetcher(context, generateCurveKeyPair(), f.invite(), "node_7", table(f, {0}),
                       options(dir.path, 1 << 20));
  EXPECT_EQ(readAll(fetcher.ready(0, 20s)), f.chunks.at(0));
  EXPECT_THROW(fetcher.ready(3, 1s), Error) << "not given yet";
  fetcher.add(table(f, {3, 0, 1}));
  EXPECT_EQ(readAll(fetcher.ready(3, 20s)), f.chunks.at(3));
  EXPECT_EQ(readAll(fetcher.ready(1, 20s)), f.chunks.at(1));
  EXPECT_EQ(readAll(fetcher.ready(0, 20s)), f.chunks.at(0));
  EXPECT_EQ(fetcher.stats().fetched, 3u) << "chunk 0 was already among them";
  EXPECT_THROW(fetcher.add({{9, "/data/big.bin", 2u << 20, "crc32:00000000"}}), Error)
      << "larger than the cache";
}

TEST(ChunkFetcher, AChunkCorruptedEveryTimeIsRefusedNamingItAndNeverReachesTheCache) {
  CacheDir dir;
  FakeChunkCoordinator f;
  f.chunks = {{1, pattern(100000, 1)}, {3, pattern(100000, 3)}};
  f.corrupt = 3;
  f.corrupt_times = 1000;
  f.cache_dir = dir.path;
  f.start();
  zmq::context_t context;
  ChunkFetcher fetcher(context, generateCurveKeyPair(), f.invite(), "node_7", table(f, {1, 3}),
                       options(dir.path, 1 << 20));
  EXPECT_EQ(readAll(fetcher.ready(1, 20s)), f.chunks.at(1));
  try {
    fetcher.ready(3, 20s);
    FAIL() << "a corrupted chunk was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("chunk 3 (train_3.bin) fetched from the coordinator at " +
                                         f.bound_address + " has checksum crc32:"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("refused after 3 fetches"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fetcher.stats().refetched, 2u);
  EXPECT_EQ(f.bad_final_files.load(), 0);
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_NE(e.path().filename().string().rfind("3-", 0), 0u) << e.path() << " left behind";
}

TEST(ChunkFetcher, AChunkTheCoordinatorRefusesEndsWithItsReasonNamingTheChunk) {
  CacheDir dir;
  FakeChunkCoordinator f;
  f.chunks = {{0, pattern(1000, 0)}, {1, pattern(1000, 1)}};
  f.refused = {1};
  f.cache_dir = dir.path;
  f.start();
  zmq::context_t context;
  ChunkFetcher fetcher(context, generateCurveKeyPair(), f.invite(), "node_2", table(f, {1, 0}),
                       options(dir.path, 1 << 20));
  for (int64_t id : {1, 0}) {
    try {
      fetcher.ready(id, 20s);
      FAIL() << "chunk " << id << " was given";
    } catch (const Error& e) {
      const std::string expected = id == 1 ? "served data: the coordinator at " + f.bound_address +
                                                 " refused chunk 1 (train_1.bin): chunk 1 is dealt to "
                                                 "cluster 1, not to cluster 0"
                                           : "served data: chunk 0 (train_0.bin) was not fetched: the "
                                             "coordinator at " + f.bound_address + " refused chunk 1";
      EXPECT_EQ(std::string(e.what()).substr(0, expected.size()), expected);
    }
  }
}

TEST(ChunkFetcher, ACoordinatorThatDoesNotAnswerEndsTheFetchNamingTheChunkAndTheAddress) {
  CacheDir dir;
  const int port = testutil::freeLoopbackPorts(1)[0];
  const Invite nobody{"127.0.0.1", port, generateCurveKeyPair().public_key, "00112233445566778899aabbccddeeff"};
  zmq::context_t context;
  ChunkFetchOptions o = options(dir.path, 1 << 20);
  o.answer_timeout = 200ms;
  o.attempts = 2;
  ChunkFetcher fetcher(context, generateCurveKeyPair(), nobody, "node_2",
                       {{5, "/data/shard_5.npy", 100, "crc32:00000000"}}, o);
  try {
    fetcher.ready(5, 20s);
    FAIL() << "nothing was served";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "served data: chunk 5 (shard_5.npy): no answer from the coordinator at 127.0.0.1:" +
                                         std::to_string(port) + " for bytes 0+ after 2 tries of 200 ms");
  }
  EXPECT_THROW(fetcher.ready(6, 1s), Error) << "chunk 6 is not this Root's";
}

TEST(ChunkFetcher, AChunkLargerThanTheCacheIsRefusedAtTheStartNamingBothSizes) {
  CacheDir dir;
  zmq::context_t context;
  const Invite somewhere{"127.0.0.1", 9, generateCurveKeyPair().public_key, "00112233445566778899aabbccddeeff"};
  try {
    ChunkFetcher fetcher(context, generateCurveKeyPair(), somewhere, "node_2",
                         {{5, "/data/big.bin", 2000, "crc32:00000000"}}, options(dir.path, 1000));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "served data: chunk 5 (big.bin) is 2000 bytes, more than the chunk cache holds (1000 "
              "bytes): raise the cache size");
  }
}

}  // namespace
}  // namespace cairn
