#include "node/transport/CurveSecurity.h"

#include <zmq_addon.hpp>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

ZapAuthenticator::ZapAuthenticator(zmq::context_t& context, std::map<std::string, std::string> allowed)
    : ZapAuthenticator(context, std::move(allowed), /*any_key=*/false) {}

ZapAuthenticator::ZapAuthenticator(zmq::context_t& context, AnyKey)
    : ZapAuthenticator(context, {}, /*any_key=*/true) {}

// The policy is set before the thread starts: no connection is ever judged by a half-made one.
ZapAuthenticator::ZapAuthenticator(zmq::context_t& context, std::map<std::string, std::string> allowed,
                                   bool any_key)
    : allowed_(std::move(allowed)), any_key_(any_key), socket_(context, zmq::socket_type::rep) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { run(); });
}

void ZapAuthenticator::setAllowed(std::map<std::string, std::string> allowed) {
  std::lock_guard<std::mutex> lock(mutex_);
  allowed_ = std::move(allowed);
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_ = true;
  thread_.join();
}

void ZapAuthenticator::run() {
  zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
  while (!stop_) {
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> request;
    if (!zmq::recv_multipart(socket_, std::back_inserter(request), zmq::recv_flags::dontwait)) continue;
    // RFC 27 request: version, request id, domain, address, identity, mechanism, credentials...
    std::string status = "400", text = "not allowed", user;
    std::string request_id = request.size() > 1 ? request[1].to_string() : "";
    if (request.size() >= 7 && request[0].to_string() == "1.0" && request[5].to_string() == "CURVE" &&
        request[6].size() == 32) {
      char z85[41];
      zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
      std::unique_lock<std::mutex> lock(mutex_);
      auto it = allowed_.find(z85);
      if (it != allowed_.end() || any_key_) {
        status = "200", text = "OK", user = it != allowed_.end() ? it->second : std::string(z85);
        ++accepted_;
      } else {
        lock.unlock();
        ++rejected_;
        // A peer not told of this node yet, or one that no longer is its peer, dials again every
        // 100 ms or so: said the first 3 times per key, then at powers of two.
        const std::string key = refused_by_key_.size() < kMaxRefusedKeys || refused_by_key_.count(z85)
                                    ? std::string(z85)
                                    : std::string("(other keys)");
        const uint64_t n = ++refused_by_key_[key];
        if (logWorthy(n, 3))
          CAIRN_WARN("refused a connection from ", request.size() > 3 ? request[3].to_string() : "?",
                     ": its CURVE key ", key, " is not on this node's list [", n,
                     " refusal(s) of it so far]");
      }
    } else {
      ++rejected_;
    }
    std::vector<zmq::message_t> reply;
    reply.emplace_back(std::string("1.0"));
    reply.emplace_back(request_id);
    reply.emplace_back(status);
    reply.emplace_back(text);
    reply.emplace_back(user);
    reply.emplace_back();
    zmq::send_multipart(socket_, reply);
  }
}

}  // namespace cairn
