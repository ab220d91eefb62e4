// Served chunks, the coordinator's side (coordinator/ChunkServer.h): pieces are the file's bytes
// (checked against the bytes the test wrote), the last piece is short, and every refusal names the
// chunk: another cluster's chunk, an unknown chunk, an offset past the end, a file that changed.
// ChunkService (coordinator/ChunkService.h): the same answers off the coordinator's loop.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <algorithm>
#include <fstream>
#include <future>
#include <set>

#include "coordinator/ChunkServer.h"
#include "coordinator/ChunkService.h"

namespace cairn::coordinator {
namespace {

namespace fs = std::filesystem;

struct Files {
  std::string dir = (fs::temp_directory_path() / ("cairn_chunk_server_" + std::to_string(::getpid()))).string();
  Files() { fs::create_directories(dir); }
  ~Files() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  }
};

ChunkReply decoded(const Frames& f) {
  std::string why;
  auto r = decodeChunkReply(f, &why);
  if (!r) throw std::runtime_error("undecodable answer: " + why);
  return *r;
}

std::string refusal(const Frames& f) {
  const ChunkReply r = decoded(f);
  if (!std::holds_alternative<ChunkRefused>(r)) return "(a piece)";
  return std::get<ChunkRefused>(r).reason;
}

TEST(ChunkServer, ServesPiecesOfItsClustersChunksAndRefusesTheRestNamingTheChunk) {
  Files files;
  std::string a(1000, '\0'), b = "the second shard";
  for (size_t i = 0; i < a.size(); ++i) a[i] = char(i * 7 + 3);
  ChunkServer server({{0, files.write("train_0.bin", a), a.size(), "crc32:0", 0},
                      {1, files.write("train_1.bin", b), b.size(), "crc32:0", 1}},
                     {{0, 2}});
  const ChunkReply first = decoded(server.answer({"node_1", 0, 0, 400}, 0));
  ASSERT_TRUE(std::holds_alternative<ChunkPiece>(first));
  EXPECT_EQ(std::get<ChunkPiece>(first).bytes, a.substr(0, 400));
  EXPECT_EQ(std::get<ChunkPiece>(first).total, 1000u);
  const ChunkReply last = decoded(server.answer({"node_1", 0, 800, 400}, 0));
  ASSERT_TRUE(std::holds_alternative<ChunkPiece>(last));
  EXPECT_EQ(std::get<ChunkPiece>(last).bytes, a.substr(800)) << "the last piece is short";
  EXPECT_EQ(std::get<ChunkPiece>(last).offset, 800u);
  EXPECT_EQ(std::get<ChunkPiece>(decoded(server.answer({"node_5", 1, 4, 6}, 1))).bytes, "second");

  EXPECT_EQ(refusal(server.answer({"node_1", 1, 0, 10}, 0)),
            "chunk 1 is dealt to cluster 1 (deal: from epoch 0: 2 clusters), never to node_1's cluster 0");
  EXPECT_EQ(refusal(server.answer({"node_1", 9, 0, 10}, 0)),
            "chunk 9 is not served by this coordinator");
  EXPECT_EQ(refusal(server.answer({"node_1", 0, 1000, 10}, 0)),
            "chunk 0: offset 1000 is past its end (1000 bytes)");
  files.write("train_0.bin", a + "more");
  EXPECT_EQ(refusal(server.answer({"node_1", 0, 0, 10}, 0)),
            "chunk 0 (" + files.dir + "/train_0.bin) is 1004 bytes on the coordinator, 1000 when "
            "the run was planned: it changed");
  EXPECT_EQ(server.piecesServed(), 3u);
  EXPECT_EQ(server.refused(), 4u);
}

}  // namespace
}  // namespace cairn::coordinator

#include "trainer/Sampler.h"

namespace cairn::coordinator {
namespace {

// The coordinator deals chunks to clusters exactly as the Roots' samplers do: for each cluster,
// the chunks whose samples ShardSampler puts in that cluster's shard are those dealtCluster gives
// it (the sampler is the reference: it decides what a Root reads).
TEST(ChunkServer, DealsChunksAsTheSamplerDoes) {
  const std::vector<int64_t> sizes = {5, 7, 3, 9, 4, 6};
  std::vector<int64_t> begins{0};
  for (int64_t s : sizes) begins.push_back(begins.back() + s);
  for (const std::vector<int64_t>& listed :
       {std::vector<int64_t>{}, std::vector<int64_t>{4, 1, 5}, std::vector<int64_t>{2, 0, 3, 5, 1}})
    for (int clusters : {1, 2, 3}) {
      for (int c = 0; c < clusters; ++c) {
        ShardSampler sampler(sizes, c, clusters, listed, 7);
        std::set<int64_t> sampled;
        for (int64_t id : sampler.shard())
          sampled.insert(int64_t(std::upper_bound(begins.begin(), begins.end(), id) - begins.begin()) - 1);
        std::set<int64_t> dealt;
        for (int64_t k = 0; k < int64_t(sizes.size()); ++k)
          if (dealtCluster(k, listed, int64_t(sizes.size()), clusters) == c) dealt.insert(k);
        EXPECT_EQ(dealt, sampled) << "cluster " << c << " of " << clusters << ", " << listed.size()
                                  << " listed";
      }
    }
  EXPECT_EQ(dealtCluster(3, {4, 1}, 6, 2), -2) << "not listed";
  EXPECT_EQ(dealtCluster(0, {}, 1, 3), -1) << "one shard: every cluster";
}

}  // namespace
}  // namespace cairn::coordinator

namespace cairn::coordinator {
namespace {

// The test set of a served job (data.test_location on the coordinator's machine): planning writes
// its chunk table into data.test_shards, numbered after the training chunks, with the CRC-32
// zlib gives (the reference: CRC-32 of "123456789" is cbf43926, the standard check value); the
// server lets every cluster fetch a test chunk (they are not dealt) and refuses an unknown one.
TEST(ChunkServer, ServesTheTestChunksToEveryClusterAndRefusesAnUnknownOne) {
  Files files;
  fs::create_directories(files.dir + "/train");
  fs::create_directories(files.dir + "/val");
  files.write("train/train_0.bin", "abcdefghijklm");  // 13 bytes: 3 blocks of 4 + 1
  files.write("train/train_1.bin", "nopqrstuv");      // 9 bytes: 2 blocks
  files.write("val/val_0.bin", "123456789");
  JobSpec job;
  job.data.location = files.dir + "/train";
  job.data.format = "tokens";
  job.data.options = {{"source", "coordinator"}, {"test_location", files.dir + "/val"},
                      {"block_length", 4}};
  addServedChunkTable(job);
  ASSERT_EQ(job.data.options["shards"].size(), 2u);
  EXPECT_EQ(job.data.options["test_shards"],
            nlohmann::json::parse(R"([{"chunk": 2, "file": "val_0.bin", "bytes": 9, "samples": 2,
                                        "crc32": "crc32:cbf43926"}])"));

  std::vector<ServedChunk> table = servedChunks(job);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[0].dealt, 0);
  EXPECT_EQ(table[1].dealt, 1);
  EXPECT_EQ(table[2].chunk, 2);
  EXPECT_EQ(table[2].dealt, -1) << "every cluster evaluates on the whole test set";
  EXPECT_EQ(table[2].path, files.dir + "/val/val_0.bin");
  ChunkServer server(std::move(table), {{0, 2}});
  for (int cluster : {0, 1}) {
    const ChunkReply piece = decoded(server.answer({"node_" + std::to_string(cluster), 2, 0, 64}, cluster));
    ASSERT_TRUE(std::holds_alternative<ChunkPiece>(piece)) << "cluster " << cluster;
    EXPECT_EQ(std::get<ChunkPiece>(piece).bytes, "123456789");
  }
  EXPECT_EQ(refusal(server.answer({"node_0", 3, 0, 64}, 0)), "chunk 3 is not served by this coordinator");
  EXPECT_EQ(refusal(server.answer({"node_0", 1, 0, 64}, 0)),
            "chunk 1 is dealt to cluster 1 (deal: from epoch 0: 2 clusters), never to node_0's cluster 0");
  // A third cluster grown later evaluates on the whole test set too.
  server.follow({{0, 2}, {4, 3}});
  EXPECT_TRUE(std::holds_alternative<ChunkPiece>(decoded(server.answer({"node_9", 2, 0, 64}, 2))));

  // Without test_location there is no test table.
  JobSpec plain = job;
  plain.data.options = {{"source", "coordinator"}, {"block_length", 4}, {"test_fraction", 0}};
  addServedChunkTable(plain);
  EXPECT_FALSE(plain.data.options.contains("test_shards"));
  EXPECT_EQ(servedChunks(plain).size(), 2u);
}

}  // namespace
}  // namespace cairn::coordinator

namespace cairn::coordinator {
namespace {

// Growing (docs/OPERATIONS.md "Growing"): served chunks follow the deal. Four chunks, planned
// over two clusters; a deal grown to three clusters from epoch 3 deals chunk 2 to cluster 2 and
// chunk 3 to cluster 0 from then on. The rule is "dealt to that cluster in some epoch of some
// deal followed" — the sampler is the reference for who gets what in each epoch.
TEST(ChunkServer, AGrownDealIsServedToTheClustersItDealsEachChunkToAndNoOthers) {
  Files files;
  std::vector<ServedChunk> table;
  for (int64_t k = 0; k < 4; ++k)
    table.push_back({k, files.write("train_" + std::to_string(k) + ".bin", std::string(10, char('a' + k))),
                     10, "crc32:0", k});
  table.push_back({4, files.write("test_0.bin", "test chunk"), 10, "crc32:0", -1});
  ChunkServer server(table, {{0, 2}});
  auto served = [&](int64_t chunk, int cluster) {
    return std::holds_alternative<ChunkPiece>(
        decoded(server.answer({"node_" + std::to_string(cluster), chunk, 0, 10}, cluster)));
  };
  EXPECT_FALSE(served(2, 2)) << "cluster 2 does not exist before the deal grows";
  EXPECT_EQ(refusal(server.answer({"node_7", 2, 0, 10}, 2)),
            "chunk 2 is dealt to cluster 0 (deal: from epoch 0: 2 clusters), never to node_7's cluster 2");
  EXPECT_FALSE(served(3, 0));

  const std::vector<DealEntry> grown = {{0, 2}, {3, 3}};
  server.follow(grown);
  // The sampler's deal, epoch by epoch, against the server's clusters for each chunk.
  const std::vector<int64_t> sizes(4, 5);
  for (int64_t k = 0; k < 4; ++k) {
    std::set<int> dealt;
    for (int c = 0; c < 3; ++c) {
      const DealSampler sampler(sizes, c, grown, {}, 7);
      for (int64_t epoch : {0, 1, 2, 3, 4})
        for (int64_t id : sampler.shard(epoch))
          if (id / 5 == k) dealt.insert(c);
    }
    const std::vector<int> to = server.clustersOf(k);
    EXPECT_EQ(std::set<int>(to.begin(), to.end()), dealt) << "chunk " << k;
  }
  EXPECT_TRUE(served(2, 2)) << "dealt to cluster 2 only from epoch 3";
  EXPECT_TRUE(served(2, 0)) << "still cluster 0's chunk before epoch 3";
  EXPECT_TRUE(served(3, 0)) << "cluster 0's from epoch 3";
  EXPECT_TRUE(served(3, 1));
  EXPECT_EQ(refusal(server.answer({"node_5", 2, 0, 10}, 1)),
            "chunk 2 is dealt to clusters 0, 2 (deal: from epoch 0: 2, from epoch 3: 3 clusters), never "
            "to node_5's cluster 1");
  EXPECT_EQ(refusal(server.answer({"node_5", 0, 0, 10}, 5)),
            "chunk 0 is dealt to cluster 0 (deal: from epoch 0: 2, from epoch 3: 3 clusters), never "
            "to node_5's cluster 5");
  for (int c : {0, 1, 2}) EXPECT_TRUE(served(4, c)) << "every cluster evaluates on the test chunk";
  // Following the planned deal again (a growth dealt again, the next request) never narrows.
  server.follow({{0, 2}});
  EXPECT_TRUE(served(2, 2));
  // The other checks still hold for a grown cluster.
  EXPECT_EQ(refusal(server.answer({"node_2", 9, 0, 10}, 2)), "chunk 9 is not served by this coordinator");
  EXPECT_EQ(refusal(server.answer({"node_2", 2, 10, 10}, 2)),
            "chunk 2: offset 10 is past its end (10 bytes)");
}

// The coordinator's loop hands chunk requests to a ChunkService and never waits on one: while the
// worker is held inside the first job (a slow read), submitting and forwarding return at once; a
// request over the bound is dropped and counted; once the job is let go, every answer reaches its
// routing id, in order, with the job's frames.
TEST(ChunkService, AnswersOffTheLoopInOrderAndDropsBeyondItsBound) {
  zmq::context_t context;
  ChunkService service(context, /*max_pending=*/2);
  std::promise<void> started, release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(service.submit("id-1", [&started, released] {
    started.set_value();
    released.wait();
    return Frames{"one", "1"};
  }));
  started.get_future().wait();  // the worker holds job 1: the two below wait, the third is dropped
  EXPECT_TRUE(service.submit("id-2", [] { return Frames{"two"}; }));
  EXPECT_TRUE(service.submit("id-3", [] { return Frames{"three", "3", "33"}; }));
  EXPECT_FALSE(service.submit("id-4", [] { return Frames{"four"}; }));
  EXPECT_EQ(service.dropped(), 1u);
  std::vector<std::pair<std::string, Frames>> sent;
  auto send = [&sent](const std::string& id, const Frames& f) { sent.emplace_back(id, f); };
  EXPECT_EQ(service.forward(send), 0u);  // nothing ready, and no wait for it
  release.set_value();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sent.size() < 3 && std::chrono::steady_clock::now() < deadline) {
    zmq::pollitem_t item{static_cast<void*>(service.ready()), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    service.forward(send);
  }
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0], (std::pair<std::string, Frames>{"id-1", {"one", "1"}}));
  EXPECT_EQ(sent[1], (std::pair<std::string, Frames>{"id-2", {"two"}}));
  EXPECT_EQ(sent[2], (std::pair<std::string, Frames>{"id-3", {"three", "3", "33"}}));
  EXPECT_EQ(service.answered(), 3u);
}

}  // namespace
}  // namespace cairn::coordinator
