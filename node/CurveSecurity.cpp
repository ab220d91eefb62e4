#include "node/CurveSecurity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <zmq_addon.hpp>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

CurveKeyPair generateCurveKeyPair() {
  char public_key[41], secret_key[41];
  if (zmq_curve_keypair(public_key, secret_key) != 0)
    CAIRN_THROW(InternalError, "this libzmq cannot make CURVE keys (built without libsodium?)");
  return {public_key, secret_key};
}

bool isZ85Key(const std::string& key) {
  if (key.size() != 40) return false;
  static const std::string alphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  return key.find_first_not_of(alphabet) == std::string::npos;
}

void writeKeyFile(const std::string& path, const CurveKeyPair& keys) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) CAIRN_THROW(BadInput, path, ": cannot create the key file");
  ::fchmod(fd, 0600);  // whatever the umask
  const std::string text = "public " + keys.public_key + "\nsecret " + keys.secret_key + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    CAIRN_THROW(BadInput, path, ": cannot write the key file");
  }
}

CurveKeyPair readKeyFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    CAIRN_THROW(BadInput, path, ": cannot open the key file (run clusterize, or use --insecure for local debugging)");
  if (st.st_mode & 0077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 0777);
    CAIRN_THROW(BadInput, path, ": secret key file has mode ", mode,
                "; it must be readable by its owner only (chmod 600 ", path, ")");
  }
  std::ifstream in(path);
  CurveKeyPair keys;
  std::string word;
  while (in >> word) {
    std::string value;
    in >> value;
    if (word == "public") keys.public_key = value;
    else if (word == "secret") keys.secret_key = value;
  }
  if (!isZ85Key(keys.public_key) || !isZ85Key(keys.secret_key))
    CAIRN_THROW(BadInput, path, ": expected lines \"public <40-char Z85 key>\" and \"secret <key>\"");
  return keys;
}

ZapAuthenticator::ZapAuthenticator(zmq::context_t& context, std::map<std::string, std::string> allowed)
    : context_(context), allowed_(std::move(allowed)), socket_(context, zmq::socket_type::rep) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { run(); });
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
      auto it = allowed_.find(z85);
      if (it != allowed_.end()) {
        status = "200", text = "OK", user = it->second;
        ++accepted_;
      } else {
        ++rejected_;
        CAIRN_WARN("refused a connection from ", request.size() > 3 ? request[3].to_string() : "?",
                   ": its CURVE key ", z85, " is not on this node's list");
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
