#include "trainer/data/FileReader.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/Error.h"

namespace cairn {

FileReader::FileReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) CAIRN_THROW(BadInput, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    CAIRN_THROW(BadInput, path, ": not a regular file");
  }
  size_ = uint64_t(st.st_size);
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void FileReader::checkRange(uint64_t offset, uint64_t length, const char* what) const {
  if (offset > size_ || length > size_ - offset)
    CAIRN_THROW(BadInput, path_, ": ", what, " (", length, " bytes at byte ", offset,
                ") lies beyond the end of the file (", size_, " bytes)");
}

void FileReader::read(uint64_t offset, uint64_t length, void* out, const char* what) const {
  checkRange(offset, length, what);
  auto* to = static_cast<uint8_t*>(out);
  while (length > 0) {
    const ssize_t n = ::pread(fd_, to, length, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      CAIRN_THROW(BadInput, path_, ": cannot read ", what, " at byte ", offset, ": ",
                  n < 0 ? std::strerror(errno) : "the file is shorter than when it was opened");
    to += n;
    offset += uint64_t(n);
    length -= uint64_t(n);
  }
}

std::vector<uint8_t> FileReader::read(uint64_t offset, uint64_t length, const char* what) const {
  checkRange(offset, length, what);
  std::vector<uint8_t> out(length);
  read(offset, length, out.data(), what);
  return out;
}

void reserveOpenFiles(size_t files, const std::string& location) {
  // Descriptors in use now, plus `files`, plus room for sockets and logs.
  size_t open = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++open;
    ::closedir(d);
  }
  const rlim_t needed = rlim_t(open + files + 256);
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= needed) return;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < needed)
    CAIRN_THROW(BadInput, "job.json: data.location ", location, " holds ", files,
                " files, more than the open-file limit allows (ulimit -n: hard limit ",
                limit.rlim_max, "); merge shards or raise the limit");
  limit.rlim_cur = needed;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace cairn
