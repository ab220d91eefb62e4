// Shards: the files a dataset's samples live in. A dataset is a list of shards, each with a path,
// its number of samples and (on demand) a checksum of its bytes; with several shards each one is a
// chunk of data.chunk (docs/NODE_DATA.md), so fetching "chunk i" from elsewhere means fetching
// shard i and checking its checksum.
// Thread-safety: free functions, no state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace cairn {

struct ShardInfo {
  std::string path;     // the file (an npy shard: its folder)
  int64_t samples = 0;  // samples this dataset takes from it
  uint64_t bytes = 0;   // its size on disk (an npy shard: its .npy files together)
};

// What a data.location names, sorted by name: a glob pattern (it holds *, ? or [) gives its
// matches; a folder gives its entries that `accept` takes; anything else must be an existing file
// and is itself the list. BadInput naming `key` (e.g. "data.location") when the list is empty or
// the path does not exist.
std::vector<std::string> expandLocation(
    const std::string& location, const std::string& key,
    const std::function<bool(const std::filesystem::directory_entry&)>& accept);

// True when `name` ends in one of `suffixes`, ignoring case (".png" takes "A.PNG").
bool hasSuffix(const std::string& name, const std::vector<std::string>& suffixes);

// "crc32:xxxxxxxx" (zlib's CRC-32, the one Python's zlib.crc32 computes) of the shard's bytes; an
// npy shard folder: its .npy files in name order, one after the other. Reads the whole shard.
std::string shardChecksum(const ShardInfo& shard);

}  // namespace cairn
