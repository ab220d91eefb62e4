#include "coordinator/ChunkService.h"

#include <atomic>

#include "core/Log.h"

namespace cairn::coordinator {
namespace {

// Each service its own inproc endpoint (several coordinators may share a process in tests).
std::string nextEndpoint() {
  static std::atomic<uint64_t> counter{0};
  return "inproc://cairn-chunk-service-" + std::to_string(counter++);
}

}  // namespace

ChunkService::ChunkService(zmq::context_t& context, size_t max_pending)
    : max_pending_(max_pending),
      endpoint_(nextEndpoint()),
      pull_(context, zmq::socket_type::pull),
      push_(context, zmq::socket_type::push) {
  pull_.set(zmq::sockopt::rcvhwm, kReadyAnswers);
  pull_.bind(endpoint_);
  push_.set(zmq::sockopt::sndhwm, kReadyAnswers);
  push_.set(zmq::sockopt::sndtimeo, 100);  // the worker looks at stop_ between tries
  push_.set(zmq::sockopt::linger, 0);
  push_.connect(endpoint_);
  worker_ = std::thread([this] { run(); });
}

ChunkService::~ChunkService() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

bool ChunkService::submit(std::string routing_id, Job job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (jobs_.size() < max_pending_) {
      jobs_.emplace_back(std::move(routing_id), std::move(job));
      changed_.notify_one();
      return true;
    }
  }
  if (dropped_++ % 1000 == 0)
    CAIRN_WARN("coordinator: ", max_pending_, " chunk requests are waiting; dropped one unanswered (",
               dropped_, " so far; the fetcher asks again after its backoff)");
  return false;
}

size_t ChunkService::forward(const std::function<void(const std::string&, const Frames&)>& send) {
  size_t n = 0;
  for (;;) {
    zmq::message_t part;
    if (!pull_.recv(part, zmq::recv_flags::dontwait)) return n;
    const std::string routing_id = part.to_string();
    Frames frames;
    while (part.more()) {
      if (!pull_.recv(part)) break;  // the rest of a multipart message is there at once
      frames.push_back(part.to_string());
    }
    send(routing_id, frames);
    ++answered_;
    ++n;
  }
}

void ChunkService::run() {
  for (;;) {
    std::pair<std::string, Job> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      next = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Frames answer;
    try {
      answer = next.second();
    } catch (const std::exception& e) {  // serveChunkRequest refuses what a volunteer sent itself
      CAIRN_ERROR("coordinator: answering a chunk request failed: ", e.what());
      answer = encode(Rejected{std::string("the coordinator could not answer: ") + e.what()});
    }
    if (answer.empty()) continue;  // nothing to send (a job never answers with no frame)
    // Routing id, then the answer's frames: one multipart message. Only its first part can find
    // the pipe full (ZeroMQ counts whole messages against the high-water mark).
    for (;;) {
      try {
        if (push_.send(zmq::buffer(next.first), zmq::send_flags::sndmore)) break;
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    for (size_t i = 0; i < answer.size(); ++i)
      (void)push_.send(zmq::buffer(answer[i]),
                       i + 1 < answer.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

}  // namespace cairn::coordinator
