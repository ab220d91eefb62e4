#include "coordinator/CheckpointWriter.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/Error.h"
#include "core/Fnv.h"
#include "core/JsonReader.h"
#include "core/Log.h"

namespace cairn::coordinator {

CheckpointWriter::CheckpointWriter(size_t max_pending_bytes) : max_pending_bytes_(max_pending_bytes) {
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) CAIRN_THROW(InternalError, "coordinator: eventfd: ", std::strerror(errno));
  worker_ = std::thread([this] { run(); });
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
  ::close(event_fd_);
}

bool CheckpointWriter::submit(CheckpointFile file) {
  std::lock_guard<std::mutex> lock(mutex_);
  // One file always fits (a checkpoint larger than the bound is still taken when nothing waits).
  if (pending_bytes_ > 0 && pending_bytes_ + file.bytes.size() > max_pending_bytes_) {
    if (refused_++ % 100 == 0)
      CAIRN_WARN("coordinator: ", pending_bytes_, " bytes of checkpoints wait to be written; the one "
                 "of ", file.name, " at step ", file.step, " is not taken (", refused_,
                 " so far; its volunteer sends it again)");
    return false;
  }
  file.size = file.bytes.size();
  pending_bytes_ += file.size;
  queue_.push_back(std::move(file));
  changed_.notify_one();
  return true;
}

std::vector<CheckpointFile> CheckpointWriter::done() {
  uint64_t count = 0;
  (void)!::read(event_fd_, &count, sizeof count);  // EAGAIN when nothing was signalled: fine
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CheckpointFile> out(std::make_move_iterator(written_.begin()),
                                  std::make_move_iterator(written_.end()));
  written_.clear();
  return out;
}

size_t CheckpointWriter::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size() + written_.size() + (in_hand_ ? 1 : 0);
}

void CheckpointWriter::run() {
  for (;;) {
    CheckpointFile file;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      file = std::move(queue_.front());
      queue_.pop_front();
      in_hand_ = true;
    }
    const size_t size = file.bytes.size();
    try {
      if (fnv1a64(file.bytes) != file.checksum) {
        file.corrupt = true;
        file.error = "the attachment does not match its checksum";
      } else {
        std::filesystem::create_directories(std::filesystem::path(file.path).parent_path());
        writeFileDurably(file.path, file.bytes);
      }
    } catch (const std::exception& e) {
      file.error = e.what();
    }
    std::string().swap(file.bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_bytes_ -= size;
      in_hand_ = false;
      written_.push_back(std::move(file));
    }
    const uint64_t one = 1;
    (void)!::write(event_fd_, &one, sizeof one);
  }
}

}  // namespace cairn::coordinator
