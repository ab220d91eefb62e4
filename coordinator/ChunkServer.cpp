#include "coordinator/ChunkServer.h"

#include <algorithm>
#include <filesystem>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/Dataset.h"
#include "trainer/data/FileReader.h"

namespace cairn::coordinator {

ChunkServer::ChunkServer(std::vector<ServedChunk> chunks, const std::vector<DealEntry>& deal) {
  for (ServedChunk& c : chunks) {
    const int64_t id = c.chunk;
    if (!chunks_.emplace(id, std::move(c)).second)
      CAIRN_THROW(InternalError, "chunk table: chunk ", id, " appears twice");
  }
  follow(deal);
}

void ChunkServer::follow(const std::vector<DealEntry>& deal) {
  validateDeal(deal, "the deal chunks are served by");
  for (const DealEntry& e : deal) counts_.insert(e.clusters);
  if (deal.size() >= shown_.size()) shown_ = deal;
}

std::vector<int> ChunkServer::clustersOf(int64_t chunk) const {
  auto it = chunks_.find(chunk);
  if (it == chunks_.end() || it->second.dealt == -2) return {};
  if (it->second.dealt == -1) return {-1};
  std::set<int> clusters;
  for (int n : counts_) clusters.insert(int(it->second.dealt % n));
  return {clusters.begin(), clusters.end()};
}

ChunkServer::~ChunkServer() = default;

Frames ChunkServer::refuse(int64_t chunk, const std::string& reason) {
  ++refused_;
  CAIRN_WARN("coordinator: refused a chunk request: ", reason);
  return encode(ChunkRefused{chunk, reason.substr(0, kMaxReasonBytes)});
}

Frames ChunkServer::answer(const ChunkRequest& ask, int cluster) {
  const std::string what = "chunk " + std::to_string(ask.chunk);
  auto it = chunks_.find(ask.chunk);
  if (it == chunks_.end()) return refuse(ask.chunk, what + " is not served by this coordinator");
  const ServedChunk& c = it->second;
  if (c.dealt == -2) return refuse(ask.chunk, what + " is not among data.chunk");
  const std::vector<int> to = clustersOf(ask.chunk);
  if (c.dealt != -1 && std::find(to.begin(), to.end(), cluster) == to.end()) {
    std::string list;
    for (int k : to) list += (list.empty() ? "" : ", ") + std::to_string(k);
    std::string deal;
    for (const DealEntry& e : shown_)
      deal += (deal.empty() ? "" : ", ") + std::string("from epoch ") + std::to_string(e.from_epoch) +
              ": " + std::to_string(e.clusters);
    return refuse(ask.chunk, what + " is dealt to cluster" + (to.size() > 1 ? "s " : " ") + list +
                                 " (deal: " + deal + " clusters), never to " + ask.name +
                                 "'s cluster " + std::to_string(cluster));
  }
  if (ask.offset >= c.bytes)
    return refuse(ask.chunk, what + ": offset " + std::to_string(ask.offset) + " is past its end (" +
                                 std::to_string(c.bytes) + " bytes)");
  auto& reader = open_[ask.chunk];
  try {
    // Its size now, not when it was opened: a file replaced or grown since planning is refused.
    std::error_code ec;
    const uint64_t now = std::filesystem::file_size(c.path, ec);
    if (ec) CAIRN_THROW(BadInput, c.path, ": ", ec.message());
    if (!reader) reader = std::make_unique<FileReader>(c.path);
    if (now != c.bytes || reader->size() != c.bytes) {
      reader.reset();
      return refuse(ask.chunk, what + " (" + c.path + ") is " + std::to_string(now) +
                                   " bytes on the coordinator, " + std::to_string(c.bytes) +
                                   " when the run was planned: it changed");
    }
    const uint64_t length = std::min({ask.length, kMaxChunkPieceBytes, c.bytes - ask.offset});
    ChunkPiece piece{ask.chunk, ask.offset, c.bytes, {}};
    piece.bytes.resize(length);
    reader->read(ask.offset, length, piece.bytes.data(), "a served chunk's piece");
    ++pieces_;
    return encode(piece);
  } catch (const Error& e) {
    reader.reset();
    return refuse(ask.chunk, what + " cannot be read on the coordinator: " + e.what());
  }
}

namespace {

// The job's training and test shards as the coordinator reads them locally (source "local").
struct LocalShards {
  std::vector<ShardInfo> train, test;
};
LocalShards localShards(const JobSpec& job, DataOptions* data) {
  *data = parseDataOptions(job.data, "job.json");
  DataOptions local = *data;
  local.source = "local";
  local.shards.clear();
  local.test_shards.clear();
  const DatasetPair pair = loadDatasets(local, 0);
  LocalShards out{pair.train->shards(), {}};
  if (!local.test_location.empty()) {
    if (!pair.test || pair.test->size() == 0)
      CAIRN_THROW(BadInput, "job.json: data.test_location ", local.test_location,
                  " holds no test samples");
    out.test = pair.test->shards();
  }
  return out;
}

nlohmann::json tableRows(const std::vector<ShardInfo>& shards, int64_t first) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ShardInfo& s : shards)
    rows.push_back({{"chunk", first + int64_t(rows.size())},
                    {"file", std::filesystem::path(s.path).filename().string()},
                    {"bytes", s.bytes}, {"samples", s.samples}, {"crc32", shardChecksum(s)}});
  return rows;
}

}  // namespace

void addServedChunkTable(JobSpec& job) {
  DataOptions data;
  if (job.data.options.value("source", "local") != "coordinator") return;
  const LocalShards shards = localShards(job, &data);
  job.data.options["shards"] = tableRows(shards.train, 0);
  if (!shards.test.empty())
    job.data.options["test_shards"] = tableRows(shards.test, int64_t(shards.train.size()));
  CAIRN_INFO("coordinator: serving ", shards.train.size(), " chunks of ", job.data.location,
             shards.test.empty() ? std::string()
                                 : " and " + std::to_string(shards.test.size()) + " test chunks of " +
                                       data.test_location);
}

int64_t dealtPosition(int64_t chunk, const std::vector<int64_t>& listed, int64_t chunks) {
  if (chunks == 1) return -1;
  if (listed.empty()) return chunk;
  for (size_t i = 0; i < listed.size(); ++i)
    if (listed[i] == chunk) return int64_t(i);
  return -2;
}

int dealtCluster(int64_t chunk, const std::vector<int64_t>& listed, int64_t chunks, int clusters) {
  const int64_t p = dealtPosition(chunk, listed, chunks);
  return p < 0 ? int(p) : int(p % clusters);
}

std::vector<ServedChunk> servedChunks(const JobSpec& job) {
  DataOptions data;
  const LocalShards local = localShards(job, &data);
  const std::vector<ShardInfo>& shards = local.train;
  std::vector<ServedChunk> table;
  for (size_t k = 0; k < shards.size() && k < data.shards.size(); ++k)
    table.push_back({int64_t(k), shards[k].path, data.shards[k].bytes, data.shards[k].crc32,
                     dealtPosition(int64_t(k), data.chunk, int64_t(shards.size()))});
  // Test chunks (numbered after the training chunks) are not dealt: every cluster evaluates on
  // the whole test set.
  for (size_t k = 0; k < local.test.size() && k < data.test_shards.size(); ++k)
    table.push_back({data.test_shards[k].chunk, local.test[k].path, data.test_shards[k].bytes,
                     data.test_shards[k].crc32, -1});
  return table;
}

Frames serveChunkRequest(std::unique_ptr<ChunkServer>* server, NodeHeaders& nodes, const std::string& out,
                         const Frames& frames, const std::optional<std::string>& member,
                         const std::vector<std::vector<DealEntry>>& deals) {
  std::string why;
  const auto ask = decodeChunkRequest(frames, &why);
  if (!ask) return encode(Rejected{"malformed message: " + why});
  if (!member || *member != ask->name)
    return encode(ChunkRefused{ask->chunk, "chunk " + std::to_string(ask->chunk) + ": you are not " +
                                               ask->name + " (a volunteer asks only for itself)"});
  const std::string node_path = nodeSpecPath(out, ask->name);
  if (!std::filesystem::exists(node_path) || !std::filesystem::exists(jobSpecPath(out)))
    return encode(ChunkRefused{ask->chunk, "chunk " + std::to_string(ask->chunk) + ": " + ask->name +
                                               " has no place in a planned run"});
  const int cluster = nodes.header(ask->name).cluster;
  if (!*server) {
    const JobSpec job = readJobSpec(jobSpecPath(out));
    if (job.data.options.value("source", "local") != "coordinator")
      return encode(ChunkRefused{ask->chunk, "this run's data is not served (data.source is not "
                                             "\"coordinator\")"});
    if (deals.empty()) CAIRN_THROW(InternalError, "serveChunkRequest: no deal to serve by");
    *server = std::make_unique<ChunkServer>(servedChunks(job), deals.front());
  }
  for (const std::vector<DealEntry>& deal : deals) (*server)->follow(deal);
  return (*server)->answer(*ask, cluster);
}

}  // namespace cairn::coordinator
