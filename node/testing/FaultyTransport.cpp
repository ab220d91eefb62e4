#include "node/testing/FaultyTransport.h"

#include <thread>

namespace cairn {

void FaultyTransport::disconnect(const std::string& peer) {
  std::lock_guard<std::mutex> lock(cut_mutex_);
  cut_peers_.emplace(peer, std::chrono::steady_clock::now());
}

void FaultyTransport::disconnectAll(bool on) {
  std::lock_guard<std::mutex> lock(cut_mutex_);
  if (on && !disconnect_all_) all_cut_since_ = std::chrono::steady_clock::now();
  disconnect_all_ = on;
}

void FaultyTransport::setDisconnectAfterSends(uint64_t sends) {
  disconnect_at_send_ = sends == 0 ? 0 : sends_ + sends;
}

PeerLiveness FaultyTransport::liveness(const std::string& peer) const {
  {
    std::lock_guard<std::mutex> lock(cut_mutex_);
    if (disconnect_all_) return {PeerState::kDisconnected, all_cut_since_};
    auto it = cut_peers_.find(peer);
    if (it != cut_peers_.end()) return {PeerState::kDisconnected, it->second};
  }
  return inner_.liveness(peer);
}

void FaultyTransport::reconnect(const std::string& peer) {
  std::lock_guard<std::mutex> lock(cut_mutex_);
  cut_peers_.erase(peer);
}

bool FaultyTransport::isCut(const std::string& peer) const {
  if (disconnect_all_) return true;
  std::lock_guard<std::mutex> lock(cut_mutex_);
  return cut_peers_.count(peer) > 0;
}

double FaultyTransport::uniform() {
  std::lock_guard<std::mutex> lock(rng_mutex_);
  rng_state_ ^= rng_state_ >> 12;
  rng_state_ ^= rng_state_ << 25;
  rng_state_ ^= rng_state_ >> 27;
  return static_cast<double>((rng_state_ * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

SendStatus FaultyTransport::send(const std::string& peer, const Message& message,
                                 std::chrono::milliseconds timeout) {
  const uint64_t sent = ++sends_;
  if (const uint64_t at = disconnect_at_send_; at != 0 && sent > at && !disconnect_all_)
    disconnectAll(true);
  if (isCut(peer)) {
    // A vanished peer looks like a full queue that never drains.
    std::this_thread::sleep_for(timeout);
    return SendStatus::kTimedOut;
  }
  const int every = drop_every_;
  if ((every > 0 && sent % every == 0) || (drop_probability_ > 0 && uniform() < drop_probability_)) {
    ++dropped_;
    return SendStatus::kSent;  // the sender believes it went out
  }
  if (const int d = delay_ms_; d > 0) std::this_thread::sleep_for(std::chrono::milliseconds(d));
  if (const double rate = bytes_per_second_; rate > 0) {
    size_t bytes = 0;
    for (const auto& t : message.tensors) bytes += t.tensor.nbytes();
    std::this_thread::sleep_for(std::chrono::duration<double>(double(bytes) / rate));
  }
  const Message* outgoing = &message;
  Message corrupted;
  if (corrupt_) {
    corrupted = message;
    for (auto& t : corrupted.tensors) {
      if (t.tensor.numel() == 0) continue;
      t.tensor = t.tensor.contiguous().clone();
      auto* bytes = static_cast<uint8_t*>(t.tensor.data_ptr());
      const size_t n = t.tensor.nbytes();
      const size_t at = static_cast<size_t>(uniform() * n) % n;
      // Flip a high bit (bool tensors: flip the whole value so it stays 0/1).
      bytes[at] ^= t.tensor.scalar_type() == torch::kBool ? 0x01 : 0x40;
      ++corrupted_;
      break;
    }
    outgoing = &corrupted;
  }
  const SendStatus status = inner_.send(peer, *outgoing, timeout);
  if (status == SendStatus::kSent && duplicate_) {
    if (inner_.send(peer, *outgoing, timeout) == SendStatus::kSent) ++duplicated_;
  }
  return status;
}

std::optional<Message> FaultyTransport::receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto m = inner_.receive(std::max(left, std::chrono::milliseconds(0)));
    if (!m) return std::nullopt;
    if (!isCut(m->sender)) return m;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
  }
}

}  // namespace cairn
