#include "trainer/DataOptions.h"

#include <string>
#include <vector>

#include "core/JsonReader.h"

namespace cairn {
namespace {

// One chunk table (data.shards or data.test_shards): rows in chunk order, the first numbered
// `first` (test chunks are numbered after the training chunks).
std::vector<ServedShard> parseChunkTable(JsonReader& r, const std::string& name, int64_t first) {
  std::vector<ServedShard> out;
  if (!r.raw()[name].is_array()) r.fail(name, "must be a list of chunk table rows");
  const nlohmann::json& rows = r.raw()[name];
  for (size_t k = 0; k < rows.size(); ++k) {
    const std::string key = name + "[" + std::to_string(k) + "]";
    const nlohmann::json& row = rows[k];
    auto bad = [&](const std::string& sub, const std::string& what) { r.fail(key + sub, what); };
    auto positive = [&](const char* k) {
      return row.contains(k) && row[k].is_number_integer() && row[k].get<int64_t>() > 0;
    };
    if (!row.is_object()) bad("", "must be an object {chunk, file, bytes, samples, crc32}");
    for (auto it = row.begin(); it != row.end(); ++it)
      if (it.key() != "chunk" && it.key() != "file" && it.key() != "bytes" && it.key() != "samples" &&
          it.key() != "crc32")
        bad("", "has the unknown key \"" + it.key() + "\"");
    ServedShard s;
    s.chunk = first + int64_t(k);
    if (!row.contains("chunk") || !row["chunk"].is_number_integer() || row["chunk"].get<int64_t>() != s.chunk)
      bad(".chunk", "must be " + std::to_string(s.chunk) + " (rows in chunk order" +
                        (first > 0 ? ", numbered after the " + std::to_string(first) + " training chunks)" : ")"));
    if (!row.contains("file") || !row["file"].is_string() || row["file"].get<std::string>().empty() ||
        row["file"].get<std::string>().find('/') != std::string::npos || row["file"].get<std::string>()[0] == '.')
      bad(".file", "must be a file name (no folder, not hidden)");
    s.file = row["file"].get<std::string>();
    if (!positive("bytes")) bad(".bytes", "must be a positive integer");
    s.bytes = row["bytes"].get<uint64_t>();
    if (!positive("samples")) bad(".samples", "must be a positive integer");
    s.samples = row["samples"].get<int64_t>();
    const std::string crc = row.contains("crc32") && row["crc32"].is_string() ? row["crc32"].get<std::string>() : "";
    if (crc.size() != 14 || crc.rfind("crc32:", 0) != 0 ||
        crc.find_first_not_of("0123456789abcdef", 6) != std::string::npos)
      bad(".crc32", "must be \"crc32:\" and 8 lowercase hex digits");
    s.crc32 = crc;
    out.push_back(std::move(s));
  }
  return out;
}

// data.source, data.cache_mb, data.shards, data.test_shards (docs/NODE_DATA.md "Data served by
// the coordinator").
void parseServedData(JsonReader& r, DataOptions* d) {
  d->source = r.choiceOr("source", {"local", "coordinator"}, "local");
  const bool served = d->source == "coordinator";
  for (const char* key : {"cache_mb", "shards", "test_shards"})
    if (!served && r.has(key)) r.fail(key, "applies only with data.source \"coordinator\"");
  if (!served) return;
  if (d->format != "tokens" && d->format != "safetensors")
    r.fail("source", "\"coordinator\" serves the tokens and safetensors formats only (their "
                     "shards are single files), not " + d->format);
  d->cache_mb = r.integerOr("cache_mb", 1, 1 << 30, d->cache_mb);
  if (r.has("test_shards") && d->test_location.empty())
    r.fail("test_shards", "is the table of data.test_location's chunks: it needs data.test_location");
  if (r.has("test_shards") && !r.has("shards"))
    r.fail("test_shards", "needs data.shards (test chunks are numbered after the training chunks)");
  if (!r.has("shards")) return;
  d->shards = parseChunkTable(r, "shards", 0);
  if (r.has("test_shards")) d->test_shards = parseChunkTable(r, "test_shards", int64_t(d->shards.size()));
  for (int64_t c : d->chunk)
    if (!d->shards.empty() && c >= int64_t(d->shards.size()))
      r.fail("chunk", "lists chunk " + std::to_string(c) + " but data.shards has " +
                          std::to_string(d->shards.size()) + " rows");
}

// data.normalize: {scale, mean, std}.
NormalizeOptions parseNormalize(const JsonReader& n) {
  NormalizeOptions normalize;
  n.rejectUnknownKeys({"scale", "mean", "std"});
  normalize.scale = n.numberOr("scale", 255);
  if (!(normalize.scale > 0)) n.fail("scale", "must be a positive number");
  if (n.has("mean")) normalize.mean = n.numberList("mean");
  if (n.has("std")) normalize.std = n.numberList("std");
  if (normalize.mean.empty()) n.fail("mean", "must list at least one number");
  if (normalize.std.empty()) n.fail("std", "must list at least one number");
  for (double s : normalize.std)
    if (!(s > 0)) n.fail("std", "must hold positive numbers");
  return normalize;
}

// [H, W] or one number for both.
std::vector<int64_t> imageSize(const JsonReader& reader, const std::string& key) {
  if (reader.raw()[key].is_number()) {
    const int64_t n = reader.integer(key, 1, 1 << 16);
    return std::vector<int64_t>{n, n};
  }
  std::vector<int64_t> size = reader.integerList(key, 1, 1 << 16);
  if (size.size() != 2) reader.fail(key, "must be [height, width] or one number");
  return size;
}

// data.inputs and data.targets: the tensors fed to the model and the targets tensor.
void parseTensorNames(const JsonReader& r, DataOptions* d) {
  if (r.has("inputs")) {
    d->inputs = r.stringList("inputs");
    if (d->inputs.empty()) r.fail("inputs", "must name at least one tensor");
    for (size_t i = 0; i < d->inputs.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (d->inputs[i] == d->inputs[j]) r.fail("inputs", "names \"" + d->inputs[i] + "\" twice");
  }
  d->targets = r.stringOr("targets", d->targets);
  for (const std::string& name : d->inputs)
    if (name == d->targets) r.fail("targets", "\"" + name + "\" is also one of data.inputs");
}

// Each per-format key applies to its formats only.
void checkFormatKeys(const JsonReader& r, const DataOptions& d) {
  const bool images = d.format == "idx" || d.format == "images";
  for (const char* key : {"normalize", "random_flip", "resize", "random_crop"})
    if (!images && r.has(key)) r.fail(key, "applies to the idx and images formats only");
  if (d.format != "images" && r.has("channels"))
    r.fail("channels", "applies to the images format only");
  for (const char* key : {"inputs", "targets"})
    if (d.format != "safetensors" && d.format != "npy" && r.has(key))
      r.fail(key, "applies to the safetensors and npy formats only");
  if (d.format != "tokens" && r.has("token_dtype"))
    r.fail("token_dtype", "applies to the tokens format only");
  if (d.format == "idx" && r.has("test_location"))
    r.fail("test_location", "does not apply to idx (its folder holds the t10k test files)");
}

}  // namespace

DataOptions parseDataOptions(const DataSpec& data, const std::string& source) {
  DataOptions d;
  d.location = data.location;
  d.format = data.format;
  d.chunk = data.chunk;
  JsonReader r(data.options, source, "data");
  r.rejectUnknownKeys({"test_location", "chunks", "train_samples", "test_samples", "normalize",
                       "random_flip", "resize", "random_crop", "channels", "inputs", "targets",
                       "block_length", "test_fraction", "token_dtype", "source", "cache_mb",
                       "shards", "test_shards"});
  d.test_location = r.stringOr("test_location", "");
  d.chunks = r.integerOr("chunks", 0, 1 << 30, 0);
  for (int64_t c : d.chunk)
    if (d.chunks > 0 && c >= d.chunks)
      r.fail("chunk", "lists chunk " + std::to_string(c) + " but data.chunks is " +
                          std::to_string(d.chunks));
  d.train_samples = r.integerOr("train_samples", 0, kMaxCount, 0);
  d.test_samples = r.integerOr("test_samples", 0, kMaxCount, 0);
  if (auto n = r.optionalObject("normalize")) d.normalize = parseNormalize(*n);
  d.random_flip = r.booleanOr("random_flip", false);
  if (r.has("resize")) d.resize = imageSize(r, "resize");
  if (auto c = r.optionalObject("random_crop")) {
    c->rejectUnknownKeys({"size", "padding"});
    d.random_crop.size = imageSize(*c, "size");
    d.random_crop.padding = c->integerOr("padding", 0, 1 << 12, 0);
  }
  d.channels = r.integerOr("channels", 1, 3, 3);
  if (d.channels == 2) r.fail("channels", "must be 1 (grayscale) or 3 (RGB)");
  parseTensorNames(r, &d);
  d.block_length = r.integerOr("block_length", 1, 1 << 20, d.block_length);
  d.test_fraction = r.numberOr("test_fraction", d.test_fraction);
  if (!(d.test_fraction >= 0 && d.test_fraction < 1)) r.fail("test_fraction", "must be in [0, 1)");
  d.token_dtype = r.choiceOr("token_dtype", {"uint8", "uint16", "uint32"}, d.token_dtype);
  checkFormatKeys(r, d);
  parseServedData(r, &d);
  return d;
}

}  // namespace cairn
