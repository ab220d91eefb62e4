// FileReader: one open data file read with pread(2) at any offset, straight into the caller's
// buffer (a batch tensor's memory). Token and array datasets read their samples through it:
// memory holds a batch, never the file; the kernel's page cache (reclaimable, charged to no
// process's RSS) keeps what is hot.
//
// Why not mmap: a C micro-benchmark on the development machine (Linux 6.18, ext4 with large
// folios, 2 cores), reading 526,336 random 512-byte samples (64 per batch) out of four 64 MiB
// shards:
//   mmap, pages left mapped              0.26 s, peak RSS +256 MiB (touched pages stay in RSS)
//   mmap + MADV_DONTNEED every batch       11 s, peak RSS +117 MiB (a fault maps a 2 MiB folio)
//   mmap + MADV_DONTNEED every sample      31 s, peak RSS   +4 MiB
//   pread into the batch                  1.0 s, peak RSS   +0 MiB
// and a mapping counts whole against RLIMIT_AS (ulimit -v), so a mapped dataset larger than that
// limit cannot be opened at all, while pread works under any limit.
// Ownership: owns the descriptor. Thread-safety: read() may be called from several threads (pread
// has no shared file position).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cairn {

class FileReader {
 public:
  // BadInput naming `path` when it cannot be opened or is not a regular file.
  explicit FileReader(const std::string& path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // Bytes [offset, offset + length) into `out`; BadInput naming the file and `what` when the range
  // is not inside the file (or the file shrank since it was opened).
  void read(uint64_t offset, uint64_t length, void* out, const char* what) const;
  std::vector<uint8_t> read(uint64_t offset, uint64_t length, const char* what) const;

 private:
  void checkRange(uint64_t offset, uint64_t length, const char* what) const;

  std::string path_;
  uint64_t size_ = 0;
  int fd_ = -1;
};

// Raises the soft open-file limit (ulimit -n) so that `files` more descriptors fit, up to the hard
// limit; BadInput naming `location` when even that is too small.
void reserveOpenFiles(size_t files, const std::string& location);

}  // namespace cairn
