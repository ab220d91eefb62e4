#include "trainer/data/ShardFiles.h"

#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>

#include "core/Error.h"

namespace cairn {

namespace fs = std::filesystem;

std::vector<std::string> expandLocation(
    const std::string& location, const std::string& key,
    const std::function<bool(const fs::directory_entry&)>& accept) {
  std::vector<std::string> out;
  if (location.empty()) CAIRN_THROW(BadInput, "job.json: ", key, " is empty");
  if (location.find_first_of("*?[") != std::string::npos) {
    glob_t matches{};
    const int rc = ::glob(location.c_str(), GLOB_ERR, nullptr, &matches);
    for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) out.push_back(matches.gl_pathv[i]);
    ::globfree(&matches);
    if (rc == GLOB_NOMATCH || out.empty())
      CAIRN_THROW(BadInput, "job.json: ", key, " \"", location, "\" matches no file");
    if (rc != 0) CAIRN_THROW(BadInput, "job.json: ", key, " \"", location, "\": cannot list it");
  } else {
    std::error_code error;
    const fs::file_status status = fs::status(location, error);
    if (error || !fs::exists(status))
      CAIRN_THROW(BadInput, "job.json: ", key, " ", location, ": no such file or folder");
    if (!fs::is_directory(status)) return {location};
    for (const fs::directory_entry& e : fs::directory_iterator(location, error)) {
      const std::string name = e.path().filename().string();
      if (!name.empty() && name[0] != '.' && accept(e)) out.push_back(e.path().string());
    }
    if (error) CAIRN_THROW(BadInput, "job.json: ", key, " ", location, ": cannot list the folder");
    if (out.empty())
      CAIRN_THROW(BadInput, "job.json: ", key, " ", location, ": the folder holds no data file");
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool hasSuffix(const std::string& name, const std::vector<std::string>& suffixes) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  for (const std::string& s : suffixes)
    if (lower.size() >= s.size() && lower.compare(lower.size() - s.size(), s.size(), s) == 0)
      return true;
  return false;
}

std::string shardChecksum(const ShardInfo& shard) {
  std::vector<std::string> files;
  if (fs::is_directory(shard.path)) {
    for (const fs::directory_entry& e : fs::directory_iterator(shard.path))
      if (hasSuffix(e.path().filename().string(), {".npy"})) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(shard.path);
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buffer(1 << 20);
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) CAIRN_THROW(BadInput, file, ": cannot open");
    while (in) {
      in.read(buffer.data(), std::streamsize(buffer.size()));
      crc = crc32(crc, reinterpret_cast<const Bytef*>(buffer.data()), uInt(in.gcount()));
    }
    if (!in.eof()) CAIRN_THROW(BadInput, file, ": cannot read");
  }
  char text[16];
  std::snprintf(text, sizeof text, "%08lx", static_cast<unsigned long>(crc));
  return std::string("crc32:") + text;
}

}  // namespace cairn
