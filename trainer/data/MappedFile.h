// MappedFile: a whole file mapped read-only into memory (POSIX mmap), for data that is used whole
// (a raw IDX file: the image tensor wraps the mapping with torch::from_blob, no copy). Why plain
// mmap and no library: the project's Debian dependencies hold none for it (Boost is not one of
// them) and the calls needed are open/fstat/mmap/munmap. Datasets read sample by sample out of
// files that may exceed memory use FileReader instead (trainer/data/FileReader.h says why).
// Ownership: owns the mapping. Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>

namespace cairn {

class MappedFile {
 public:
  // BadInput naming `path` when it cannot be opened, is not a regular file or cannot be mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  const uint8_t* data() const { return data_; }

 private:
  std::string path_;
  uint64_t size_ = 0;
  const uint8_t* data_ = nullptr;
};

}  // namespace cairn
