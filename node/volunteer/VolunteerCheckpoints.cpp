#include "node/volunteer/VolunteerCheckpoints.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "node/transport/ZmqSockets.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/VolunteerSockets.h"
#include "trainer/Checkpoint.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Steps of the files named step_<N>.ckpt in `dir` (as trainer/Checkpoint.h names them), newest first.
std::vector<int64_t> stepsNewestFirst(const std::string& dir) {
  static const std::regex pattern("step_([0-9]{1,18})\\.ckpt");
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, pattern)) steps.push_back(std::stoll(m[1].str()));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

bool sameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// The whole file open as `fd`; false on a read error.
bool readAll(int fd, size_t size, std::string* bytes) {
  bytes->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, bytes->data() + done, size - done, off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

}  // namespace

VolunteerCheckpoints::VolunteerCheckpoints(zmq::context_t& context, const CurveKeyPair& own,
                                           const Invite& invite, std::string name,
                                           std::string checkpoint_dir, CheckpointUploadOptions options)
    : socket_(volunteerSocket(context, own, invite, /*immediate=*/true, options.max_message_bytes, 1)),
      monitor_(monitorSocket(context, socket_, ZMQ_EVENT_DISCONNECTED, "checkpoint_uploads", name)),
      coordinator_(invite.address()),
      name_(std::move(name)),
      dir_(std::move(checkpoint_dir)),
      options_(options) {
  CAIRN_ENFORCE(options_.upload_mbps > 0, "VolunteerCheckpoints needs upload_mbps > 0");
  thread_ = std::thread([this] { run(); });
}

VolunteerCheckpoints::~VolunteerCheckpoints() { stop(); }

void VolunteerCheckpoints::finish(milliseconds timeout) {
  const auto by = Clock::now() + timeout;
  finish_by_ns_ = std::max<int64_t>(1, by.time_since_epoch().count());
  if (thread_.joinable()) thread_.join();
}

void VolunteerCheckpoints::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

bool VolunteerCheckpoints::newest(FileId* id, std::string* bytes) {
  for (int64_t step : stepsNewestFirst(dir_)) {
    const std::string path = checkpointPath(dir_, step);
    struct stat before {};
    if (::stat(path.c_str(), &before) != 0) continue;  // deleted meanwhile (the trainer keeps a few)
    FileId f{step, uint64_t(before.st_ino), uint64_t(before.st_size),
             int64_t(before.st_mtim.tv_sec) * 1000000000 + before.st_mtim.tv_nsec};
    if (f == acked_) return false;  // the coordinator holds the newest valid one
    if (f == last_bad_) continue;
    try {
      readCheckpoint(dir_, step);  // verifies it as validCheckpointSteps does
    } catch (const Error& e) {
      if (!::access(path.c_str(), F_OK)) {
        CAIRN_WARN("not uploading checkpoint ", path, ": ", e.what());
        last_bad_ = f;
      }
      continue;
    }
    // The trainer writes a checkpoint under another name and renames it into place, never in
    // place: the same inode, size and mtime as verified means the same bytes.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat now {};
    const bool same = ::fstat(fd, &now) == 0 && sameFile(before, now);
    const bool read = same && readAll(fd, size_t(now.st_size), bytes);
    ::close(fd);
    if (!read) continue;
    *id = f;
    return true;
  }
  return false;
}

void VolunteerCheckpoints::readReplies(milliseconds wait) {
  const auto message = receiveReply(socket_, wait, options_.max_message_bytes, "checkpoint uploads");
  if (!message) return;
  if (const auto* r = std::get_if<Rejected>(&*message)) {
    CAIRN_WARN("the coordinator refused a checkpoint: ", r->reason);
    if (has_in_flight_) acked_ = in_flight_;  // not sent again; a newer one will be
    has_in_flight_ = false;
    return;
  }
  const auto* ack = std::get_if<CheckpointAck>(&*message);
  if (!ack || ack->name != name_) return;
  acked_step_ = ack->step;
  if (ack->keep_from >= 0) keep_from_ = ack->keep_from;
  if (!has_in_flight_) return;
  has_in_flight_ = false;
  acked_ = in_flight_;  // held, or superseded by a newer one the coordinator holds: not resent
  if (ack->step == in_flight_.step)
    CAIRN_INFO("uploaded checkpoint step ", in_flight_.step, ": ", in_flight_.size, " bytes in ",
               secondsOf(Clock::now() - sent_at_), " s");
  else
    CAIRN_INFO("the coordinator keeps its checkpoint of step ", ack->step, " rather than step ",
               in_flight_.step);
}

bool VolunteerCheckpoints::connectionClosed() {
  uint16_t event = 0;
  uint32_t value = 0;
  bool closed = false;
  while (readMonitorEvent(monitor_, &event, &value)) closed = closed || event == ZMQ_EVENT_DISCONNECTED;
  return closed;
}

void VolunteerCheckpoints::run() {
  auto next_look = Clock::now();
  auto next_send = Clock::now();  // the rate limit
  auto last_taken = Clock::now();  // the last send taken (or the start)
  bool away = false, finishing = false;
  while (!stop_.load()) {
    const auto now = Clock::now();
    if (const int64_t by = finish_by_ns_.load(); by != 0) {
      if (!finishing) next_look = now;  // look at once for the last checkpoint
      finishing = true;
      if (now.time_since_epoch().count() >= by) {
        if (has_in_flight_)
          CAIRN_WARN("the coordinator did not acknowledge checkpoint step ", in_flight_.step,
                     " before this volunteer stopped");
        break;
      }
    }
    // A closed connection loses what the coordinator had not acknowledged: offered again at once.
    if (connectionClosed() && has_in_flight_) {
      CAIRN_INFO("the connection to the coordinator at ", coordinator_, " closed before it acknowledged "
                 "checkpoint step ", in_flight_.step, "; the newest is offered again");
      has_in_flight_ = false;
      next_look = now;
    }
    // The acknowledgement is awaited for ack_timeout after the transfer time at upload_mbps (a
    // large checkpoint at a low rate takes longer than any fixed timeout).
    if (has_in_flight_ && now - next_send > options_.ack_timeout) {
      CAIRN_WARN("the coordinator at ", coordinator_, " did not acknowledge checkpoint step ",
                 in_flight_.step, " within ", secondsOf(options_.ack_timeout), " s; sending the newest again");
      has_in_flight_ = false;
    }
    if (!has_in_flight_ && now >= next_look && now >= next_send) {
      next_look = now + options_.poll;
      FileId id;
      std::string bytes;
      if (newest(&id, &bytes)) {
        const uint64_t checksum = fnv1a64(bytes);
        const Frames message = encode(CheckpointUpload{name_, id.step, checksum, std::move(bytes)});
        const size_t size = message[1].size();
        if (trySendFrames(socket_, message)) {
          ++sent_;
          bytes_sent_ += size;
          in_flight_ = id;
          has_in_flight_ = true;
          sent_at_ = Clock::now();
          next_send = sent_at_ + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(double(size) * 8 /
                                                                   (options_.upload_mbps * 1e6)));
          away = false;
          last_taken = Clock::now();
        } else if (!away && now - last_taken >= milliseconds(10000)) {
          away = true;  // logged once, after 10 s (the first connection's handshake takes a moment)
          CAIRN_INFO("the coordinator at ", coordinator_, " takes no checkpoint now (down or "
                     "unreachable); the newest is offered again every ", secondsOf(options_.poll), " s");
        }
      } else if (finishing) {
        break;  // the coordinator holds the newest valid checkpoint
      }
    }
    const bool was_in_flight = has_in_flight_;
    readReplies(milliseconds(100));
    if (finishing && was_in_flight && !has_in_flight_) next_look = Clock::now();
  }
  zmq_socket_monitor(socket_.handle(), nullptr, 0);
  monitor_.close();
  socket_.close();
}

}  // namespace cairn
