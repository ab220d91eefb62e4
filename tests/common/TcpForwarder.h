// TcpForwarder: a TCP forwarder on loopback for transport tests. The first connection it accepts
// is carried to port `first`, every later one to `later`. freezeFirst() stops the first from
// carrying anything more while its sockets stay open: to either side, a connection whose far end
// went away without a word (a peer's process that closed a moment ago, its close not seen yet).
// holdLater() / releaseLater() stop and start carrying the later ones (their handshakes wait).
// Written by hand: no library here forwards TCP; poll() and blocking writes are enough for a few
// small messages on loopback. Thread-safety: its own thread carries; the calls are atomic flags.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cairn::testing {

class TcpForwarder {
 public:
  TcpForwarder(int listen_port, int first, int later) : first_(first), later_(later) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const sockaddr_in addr = loopback(listen_port);
    if (::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 8) != 0)
      throw std::runtime_error("forwarder: cannot listen on port " + std::to_string(listen_port));
    thread_ = std::thread([this] { run(); });
  }
  ~TcpForwarder() {
    stop_ = true;
    thread_.join();
    for (const Pair& p : pairs_) {
      ::close(p.client);
      ::close(p.server);
    }
    ::close(listen_fd_);
  }
  // Returns once the forwarder carries nothing more on the first connection (its loop has seen it).
  void freezeFirst() { setAndWait(frozen_, true); }
  // Later connections are accepted (and dialled on) but carry nothing until releaseLater().
  void holdLater() { setAndWait(held_, true); }
  void releaseLater() { setAndWait(held_, false); }
  int accepted() const { return accepted_; }
  // Bytes the client side of the first connection has sent that wait, uncarried, while it is
  // frozen (what a process that closed a moment ago would never have read); seen at each turn.
  int pendingOnFirst() const { return pending_first_; }

 private:
  struct Pair {
    int client, server;
    bool first;
    bool closed = false;  // one side closed: both shut down, never polled again
  };
  // Returns once the loop has begun a turn with `flag` at `value` (each turn polls anew).
  void setAndWait(std::atomic<bool>& flag, bool value) {
    const int turn = turns_;
    flag = value;
    while (turns_ < turn + 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  static sockaddr_in loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }
  // Reads what `from` has and writes it all to `to`; false when `from` closed.
  static bool carry(int from, int to) {
    char buffer[65536];
    const ssize_t n = ::read(from, buffer, sizeof buffer);
    if (n <= 0) return false;
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::write(to, buffer + done, size_t(n - done));
      if (w <= 0) return false;
      done += w;
    }
    return true;
  }
  void run() {  // pairs_ is this thread's until the destructor joins it
    for (; !stop_; ++turns_) {
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
      std::vector<std::pair<size_t, bool>> owner;  // pair index, client side
      for (size_t i = 0; i < pairs_.size(); ++i) {
        int pending = 0;
        if (pairs_[i].first && frozen_ && ::ioctl(pairs_[i].client, FIONREAD, &pending) == 0)
          pending_first_ = pending;
        if (pairs_[i].closed || (pairs_[i].first ? frozen_.load() : held_.load())) continue;
        fds.push_back({pairs_[i].client, POLLIN, 0});
        owner.push_back({i, true});
        fds.push_back({pairs_[i].server, POLLIN, 0});
        owner.push_back({i, false});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) accept();
      for (size_t k = 1; k < fds.size(); ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Pair& p = pairs_[owner[k - 1].first];
        if (p.closed) continue;  // its other side closed it this turn
        const bool client = owner[k - 1].second;
        if (!carry(client ? p.client : p.server, client ? p.server : p.client)) {
          ::shutdown(p.client, SHUT_RDWR);  // both ends see the close; the fds go at destruction
          ::shutdown(p.server, SHUT_RDWR);
          p.closed = true;  // else its hang-up would wake every poll from now on
        }
      }
    }
  }
  void accept() {
    const int client = ::accept(listen_fd_, nullptr, nullptr);
    if (client < 0) return;
    const bool first = accepted_ == 0;
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in addr = loopback(first ? first_ : later_);
    if (::connect(server, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(client);
      ::close(server);
      return;
    }
    ++accepted_;
    pairs_.push_back({client, server, first, false});
  }

  int first_, later_;
  int listen_fd_ = -1;
  std::vector<Pair> pairs_;
  std::atomic<bool> stop_{false}, frozen_{false}, held_{false};
  std::atomic<int> accepted_{0};
  std::atomic<int> pending_first_{0};
  std::atomic<int> turns_{0};  // loop turns begun: each builds its poll list anew
  std::thread thread_;
};

}  // namespace cairn::testing
