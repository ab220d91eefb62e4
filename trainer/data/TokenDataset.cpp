// The tokens format: files of token ids, read in place (trainer/data/FileReader.h). A file is
//   *.npy          a 1-D array of uint8, uint16, uint32, int32 or int64 (trainer/data/Npy.h)
//   an llm.c shard 256 little-endian int32 of header (magic 20240520 with version 1: uint16
//                  tokens, or magic 20240801 with version 7: uint32 tokens; [2] the token count),
//                  then the tokens (karpathy/llm.c dev/data/data_common.py)
//   anything else  tokens without a header, data.token_dtype wide (uint8 by default: a text file
//                  read as bytes, vocabulary 256)
// Sample i of a file is tokens [i L, i L + L] (L = block_length): inputs the first L, targets the
// last L; samples never span two files. Only a batch is read, widened to int64: streaming a token
// set many times the size of memory keeps the Root's memory at one batch.
#include <algorithm>
#include <cstring>

#include "core/Error.h"
#include "core/Log.h"
#include "trainer/data/FileReader.h"
#include "trainer/data/Formats.h"
#include "trainer/data/Npy.h"

namespace cairn {
namespace {

constexpr int32_t kGpt2Magic = 20240520, kLlama3Magic = 20240801;
constexpr uint64_t kLlmcHeaderBytes = 256 * 4;

struct TokenFile {
  std::unique_ptr<FileReader> file;
  uint64_t offset = 0;  // of the first token
  int64_t count = 0;    // tokens
  int width = 1;        // bytes per token
  bool is_signed = false;
};

int32_t int32At(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);  // little-endian host (x86-64, aarch64)
  return v;
}

std::shared_ptr<TokenFile> openTokenFile(const std::string& path, const std::string& token_dtype) {
  auto t = std::make_shared<TokenFile>();
  t->file = std::make_unique<FileReader>(path);
  const FileReader& f = *t->file;
  std::vector<uint8_t> head;
  if (!hasSuffix(path, {".npy"}) && f.size() >= kLlmcHeaderBytes)
    head = f.read(0, 12, "the llm.c header");
  if (hasSuffix(path, {".npy"})) {
    const NpyArray a = readNpyHeader(f);
    if (a.shape.size() != 1)
      CAIRN_THROW(BadInput, path, ": token ids must be a 1-D array (got ", a.shape.size(),
                  " dimensions)");
    const bool ok = (a.kind == 'u' && a.item_size <= 4) || (a.kind == 'i' && a.item_size >= 4);
    if (!ok)
      CAIRN_THROW(BadInput, path, ": token ids of dtype '", a.descr,
                  "' (expected uint8, uint16, uint32, int32 or int64)");
    t->offset = a.data_offset;
    t->width = a.item_size;
    t->is_signed = a.kind == 'i';
    t->count = a.elements;
  } else if (!head.empty() &&
             (int32At(head.data()) == kGpt2Magic || int32At(head.data()) == kLlama3Magic)) {
    const int32_t magic = int32At(head.data()), version = int32At(head.data() + 4);
    const int32_t count = int32At(head.data() + 8);
    if (!(magic == kGpt2Magic && version == 1) && !(magic == kLlama3Magic && version == 7))
      CAIRN_THROW(BadInput, path, ": llm.c token shard with magic ", magic, " and version ",
                  version, " (expected 20240520 with 1, or 20240801 with 7)");
    t->width = magic == kGpt2Magic ? 2 : 4;
    t->offset = kLlmcHeaderBytes;
    if (count < 0 || f.size() - t->offset != uint64_t(count) * uint64_t(t->width))
      CAIRN_THROW(BadInput, path, ": llm.c header promises ", count, " tokens of ", t->width,
                  " bytes but the file holds ", f.size() - t->offset, " bytes after the header");
    t->count = count;
  } else {
    t->width = token_dtype == "uint32" ? 4 : token_dtype == "uint16" ? 2 : 1;
    if (f.size() % uint64_t(t->width) != 0)
      CAIRN_THROW(BadInput, path, ": ", f.size(), " bytes is not a whole number of ", token_dtype,
                  " tokens (data.token_dtype)");
    t->count = int64_t(f.size() / uint64_t(t->width));
  }
  return t;
}

template <typename T>
void widen(const uint8_t* from, int64_t n, int64_t* to) {
  for (int64_t j = 0; j < n; ++j) {
    T v;
    std::memcpy(&v, from + j * int64_t(sizeof(T)), sizeof(T));
    to[j] = int64_t(v);
  }
}

// Tokens [first, first + n) of a file, as int64, into `to` (`bytes` is scratch space).
void readTokens(const TokenFile& t, int64_t first, int64_t n, int64_t* to,
                std::vector<uint8_t>* bytes) {
  bytes->resize(size_t(n * t.width));
  t.file->read(t.offset + uint64_t(first * t.width), bytes->size(), bytes->data(), "a sample");
  const uint8_t* p = bytes->data();
  switch (t.width) {
    case 1:
      return widen<uint8_t>(p, n, to);
    case 2:
      return widen<uint16_t>(p, n, to);
    case 4:
      return t.is_signed ? widen<int32_t>(p, n, to) : widen<uint32_t>(p, n, to);
    default:
      return widen<int64_t>(p, n, to);
  }
}

// A run of consecutive samples of one file.
struct Segment {
  std::shared_ptr<TokenFile> file;
  int64_t first_block = 0;  // within the file
  int64_t blocks = 0;
};

class TokenDataset : public Dataset {
 public:
  TokenDataset(std::vector<Segment> segments, int64_t block_length)
      : segments_(std::move(segments)), block_(block_length) {
    begins_.push_back(0);
    for (const Segment& s : segments_) begins_.push_back(begins_.back() + s.blocks);
  }
  int64_t size() const override { return begins_.back(); }
  Batch get(const std::vector<int64_t>& ids, bool /*training*/) const override {
    const int64_t n = int64_t(ids.size());
    torch::Tensor inputs = torch::empty({n, block_}, torch::kLong);
    torch::Tensor targets = torch::empty({n, block_}, torch::kLong);
    std::vector<int64_t> row(size_t(block_ + 1));
    std::vector<uint8_t> bytes;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[size_t(i)];
      CAIRN_ENFORCE(id >= 0 && id < size(), "sample id ", id, " of ", size());
      const size_t k =
          size_t(std::upper_bound(begins_.begin(), begins_.end(), id) - begins_.begin() - 1);
      const Segment& s = segments_[k];
      readTokens(*s.file, (s.first_block + id - begins_[k]) * block_, block_ + 1, row.data(),
                 &bytes);
      std::memcpy(inputs.data_ptr<int64_t>() + i * block_, row.data(), size_t(block_) * 8);
      std::memcpy(targets.data_ptr<int64_t>() + i * block_, row.data() + 1, size_t(block_) * 8);
    }
    return {inputs, targets, {}};
  }
  std::vector<ShardInfo> shards() const override {
    std::vector<ShardInfo> out;
    for (const Segment& s : segments_)
      out.push_back({s.file->file->path(), s.blocks, s.file->file->size()});
    return out;
  }

 private:
  std::vector<Segment> segments_;
  std::vector<int64_t> begins_;  // first sample id of each segment, then size()
  int64_t block_;
};

// Every sample of the files at `location`, file after file.
std::vector<Segment> openSegments(const std::string& location, const std::string& key,
                                  const DataOptions& o) {
  std::vector<Segment> out;
  const auto paths = expandLocation(
      location, key, [](const std::filesystem::directory_entry& e) { return e.is_regular_file(); });
  reserveOpenFiles(paths.size(), location);
  for (const std::string& path : paths) {
    auto file = openTokenFile(path, o.token_dtype);
    const int64_t blocks = file->count > 0 ? (file->count - 1) / o.block_length : 0;
    if (blocks == 0) {
      CAIRN_WARN(path, ": ", file->count, " tokens, fewer than one block of ", o.block_length,
                 " + 1: left out");
      continue;
    }
    out.push_back({file, 0, blocks});
  }
  return out;
}

// Samples [begin, end) of `all` (sample ids counted across the segments).
std::vector<Segment> slice(const std::vector<Segment>& all, int64_t begin, int64_t end) {
  std::vector<Segment> out;
  int64_t at = 0;
  for (const Segment& s : all) {
    const int64_t from = std::max(begin, at), to = std::min(end, at + s.blocks);
    if (from < to) out.push_back({s.file, s.first_block + from - at, to - from});
    at += s.blocks;
  }
  return out;
}

int64_t countOf(const std::vector<Segment>& segments) {
  int64_t n = 0;
  for (const Segment& s : segments) n += s.blocks;
  return n;
}

int64_t limitedCount(int64_t n, int64_t limit) { return limit > 0 ? std::min(n, limit) : n; }

}  // namespace

DatasetPair loadTokenDatasets(const DataOptions& o) {
  std::vector<Segment> train = openSegments(o.location, "data.location", o), test;
  if (countOf(train) == 0)
    CAIRN_THROW(BadInput, o.location, ": shorter than one block of ", o.block_length,
                " + 1 tokens");
  if (!o.test_location.empty()) {
    test = openSegments(o.test_location, "data.test_location", o);
  } else {
    const int64_t total = countOf(train);
    const int64_t test_blocks = int64_t(double(total) * o.test_fraction);
    test = slice(train, total - test_blocks, total);
    train = slice(train, 0, total - test_blocks);
  }
  DatasetPair pair;
  pair.train = std::make_unique<TokenDataset>(
      slice(train, 0, limitedCount(countOf(train), o.train_samples)), o.block_length);
  if (countOf(test) > 0)
    pair.test = std::make_unique<TokenDataset>(
        slice(test, 0, limitedCount(countOf(test), o.test_samples)), o.block_length);
  return pair;
}

}  // namespace cairn
