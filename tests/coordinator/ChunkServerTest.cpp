// Served chunks, the coordinator's side (coordinator/ChunkServer.h): pieces are the file's bytes
// (checked against the bytes the test wrote), the last piece is short, and every refusal names the
// chunk: another cluster's chunk, an unknown chunk, an offset past the end, a file that changed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "coordinator/ChunkServer.h"

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
                      {1, files.write("train_1.bin", b), b.size(), "crc32:0", 1}});
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
            "chunk 1 is dealt to cluster 1, not to node_1's cluster 0");
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
