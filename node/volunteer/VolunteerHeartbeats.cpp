#include "node/volunteer/VolunteerHeartbeats.h"

#include <algorithm>
#include <tuple>

#include "core/Log.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/volunteer/VolunteerSockets.h"

namespace cairn {

VolunteerHeartbeats::VolunteerHeartbeats(zmq::context_t& context, const CurveKeyPair& own,
                                         const Invite& invite, std::string name, std::string state,
                                         std::chrono::milliseconds interval, Progress progress)
    : socket_(volunteerSocket(context, own, invite, /*immediate=*/true, 1 << 20, 8)),
      coordinator_(invite.address()),
      name_(std::move(name)),
      state_(std::move(state)),
      interval_(interval),
      progress_(std::move(progress)) {
  thread_ = std::thread([this] { run(); });
  handlers_ = std::thread([this] { runHandlers(); });
}

VolunteerHeartbeats::~VolunteerHeartbeats() { stop(); }

void VolunteerHeartbeats::stop() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stop_ = true;
  }
  queue_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (handlers_.joinable()) handlers_.join();
}

void VolunteerHeartbeats::handLater(std::function<void()> call) {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (queue_.size() >= kMaxQueued) {
      queue_.pop_front();
      CAIRN_WARN("heartbeats: ", kMaxQueued, " coordinator messages wait for their handler; the oldest is dropped");
    }
    queue_.push_back(std::move(call));
  }
  queue_cv_.notify_one();
}

// A stop drops what is still queued: the run these messages were for is ending.
void VolunteerHeartbeats::runHandlers() {
  for (;;) {
    std::function<void()> call;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stop_.load() || !queue_.empty(); });
      if (stop_.load()) return;
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    call();
  }
}

void VolunteerHeartbeats::onPeers(std::function<void(const PeersUpdate&)> handler) {
  std::lock_guard<std::mutex> lock(peers_mutex_);
  on_peers_ = std::move(handler);
}

void VolunteerHeartbeats::onRejected(std::function<void(const Rejected&)> handler) {
  std::lock_guard<std::mutex> lock(peers_mutex_);
  on_rejected_ = std::move(handler);
}

void VolunteerHeartbeats::run() {
  using Clock = std::chrono::steady_clock;
  // A coordinator that has taken no heartbeat for this long counts as away (logged once); the
  // first connection gets the same grace.
  const auto away_after = 3 * interval_;
  auto last_taken = Clock::now();
  bool away = false;
  auto next = Clock::now();
  while (!stop_.load()) {
    const auto now = Clock::now();
    if (now >= next) {
      next = now + interval_;
      Heartbeat beat{name_, state_, -1};
      if (progress_) std::tie(beat.state, beat.step) = progress_();
      if (beat.state.empty()) beat.state = state_;
      beat.step = std::max<int64_t>(beat.step, -1);
      if (trySendFrames(socket_, encode(beat))) {
        ++sent_;
        last_taken = now;
        if (away)
          CAIRN_INFO("the coordinator at ", coordinator_, " takes heartbeats again");
        away = false;
      } else {
        ++unsent_;
        // None taken yet on this socket (its handshake is under way, or the coordinator is down):
        // tried again in 100 ms rather than an interval later, so a volunteer starting to train
        // (its waiting socket just closed) is heard on its new connection at once — the
        // coordinator counts a member whose connections all closed as gone (--gone-after-s,
        // coordinator/ConnectionWatch.h). A failed try costs nothing: it never waits.
        if (sent_.load() == 0)
          next = now + std::min<std::chrono::milliseconds>(interval_, std::chrono::milliseconds(100));
        if (!away && now - last_taken >= away_after) {
          away = true;
          CAIRN_WARN("the coordinator at ", coordinator_, " has taken no heartbeat for ",
                     std::chrono::duration<double>(now - last_taken).count(),
                     " s (down or unreachable); training goes on without it");
        }
      }
    }
    const auto wait = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()),
                               std::chrono::milliseconds(100));
    uint64_t dropped = 0;
    if (auto in = recvFrames(socket_, std::max(wait, std::chrono::milliseconds(0)), &dropped)) {
      ++received_;
      std::string why;
      const auto message = decodeToVolunteer(*in, kMaxCoordinationHeaderBytes, &why);
      const auto* peers = message ? std::get_if<PeersUpdate>(&*message) : nullptr;
      const auto* rejected = message ? std::get_if<Rejected>(&*message) : nullptr;
      std::function<void(const PeersUpdate&)> handler;
      std::function<void(const Rejected&)> refused;
      {
        std::lock_guard<std::mutex> lock(peers_mutex_);
        handler = on_peers_;
        refused = on_rejected_;
      }
      if (peers && handler) {
        handLater([handler, update = *peers] { handler(update); });
      } else if (rejected && refused) {
        handLater([refused, said = *rejected] { refused(said); });
      } else if (rejected) {
        CAIRN_WARN("the coordinator refused a heartbeat: ", rejected->reason);
      } else if (!message) {
        CAIRN_WARN("the coordinator at ", coordinator_, " sent a malformed message (dropped): ", why);
      } else {
        CAIRN_DEBUG("heartbeats: dropped a message from the coordinator (", in->size(), " frames)");
      }
    }
    received_ += dropped;
  }
  socket_.close();
}

}  // namespace cairn
