#include "node/transport/ZmqSockets.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include <zmq_addon.hpp>

#include "core/Error.h"

namespace cairn {

void allowIpv6For(zmq::socket_t& socket, const std::string& endpoint) {
  if (endpoint.find('[') != std::string::npos) socket.set(zmq::sockopt::ipv6, true);
}

void bindRetryingWhileInUse(zmq::socket_t& socket, const std::string& endpoint) {
  allowIpv6For(socket, endpoint);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    try {
      socket.bind(endpoint);
      return;
    } catch (const zmq::error_t& e) {
      if (e.num() != EADDRINUSE || std::chrono::steady_clock::now() >= deadline) throw;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool pollOrInterrupted(std::vector<zmq::pollitem_t>& items, std::chrono::milliseconds timeout) {
  try {
    zmq::poll(items, timeout);
    return true;
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
    return false;
  }
}

bool queueFirstFrame(zmq::socket_t& socket, std::vector<zmq::message_t>& frames,
                     std::chrono::milliseconds timeout) {
  auto sendNow = [&] {
    return socket
        .send(frames[0],
              (frames.size() > 1 ? zmq::send_flags::sndmore : zmq::send_flags::none) |
                  zmq::send_flags::dontwait)
        .has_value();
  };
  if (sendNow()) return true;
  zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLOUT, 0};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    std::vector<zmq::pollitem_t> items{item};
    pollOrInterrupted(items, std::max(left, std::chrono::milliseconds(0)));
    item.revents = items[0].revents;
    if ((item.revents & ZMQ_POLLOUT) && sendNow()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

void setZmtpHeartbeats(zmq::socket_t& socket, std::chrono::milliseconds interval,
                       std::chrono::milliseconds timeout) {
  if (interval.count() <= 0) return;
  socket.set(zmq::sockopt::heartbeat_ivl, int(interval.count()));
  socket.set(zmq::sockopt::heartbeat_timeout, int(timeout.count()));
  socket.set(zmq::sockopt::heartbeat_ttl, int(timeout.count()));
}

std::vector<zmq::message_t> shareFrames(std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> copies(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) copies[i].copy(frames[i]);
  return copies;
}

std::string nextMonitorEndpoint(const std::string& name, const std::string& peer) {
  static std::atomic<uint64_t> counter{0};
  return "inproc://cairn-monitor-" + name + "-" + peer + "-" + std::to_string(counter++);
}

zmq::socket_t monitorSocket(zmq::context_t& context, zmq::socket_t& socket, int events,
                            const std::string& name, const std::string& what) {
  const std::string endpoint = nextMonitorEndpoint(name, what);
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(), events) != 0)
    CAIRN_THROW(InternalError, name, ": zmq_socket_monitor for ", what, ": ",
                zmq_strerror(zmq_errno()));
  zmq::socket_t monitor(context, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect(endpoint);
  return monitor;
}

bool readMonitorEvent(zmq::socket_t& monitor, uint16_t* event, uint32_t* value) {
  for (;;) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(monitor, std::back_inserter(frames), zmq::recv_flags::dontwait))
      return false;
    if (frames.empty() || frames[0].size() < sizeof(uint16_t) + sizeof(uint32_t)) continue;
    std::memcpy(event, frames[0].data(), sizeof(*event));
    std::memcpy(value, static_cast<const char*>(frames[0].data()) + sizeof(*event), sizeof(*value));
    return true;
  }
}

#if defined(__SANITIZE_THREAD__)
void handOverFrames(std::vector<zmq::message_t>& frames) {
  for (auto& frame : frames) __tsan_release(frame.data());
}
void takeOverFrames(std::vector<zmq::message_t>& frames) {
  for (auto& frame : frames) __tsan_acquire(frame.data());
}
#else
void handOverFrames(std::vector<zmq::message_t>&) {}
void takeOverFrames(std::vector<zmq::message_t>&) {}
#endif

}  // namespace cairn
