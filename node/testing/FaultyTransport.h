// FaultyTransport: a Transport decorator that injects faults, for reliability tests (leveldb's
// fault-injection Env, applied to the network). Faults are switched on and off at run time through
// atomic settings, from any thread. Like the transport it wraps, send/receive/liveness may be
// called from several threads at once.
//   drop       — outgoing messages silently vanish (a lossy link)
//   delay      — each outgoing message waits this long first (a slow link)
//   bandwidth  — each outgoing message waits its tensor bytes / rate first, in the sending thread
//                (a thin link: a volunteer's uplink; concurrent senders each wait their own)
//   duplicate  — each outgoing message is sent twice (a retransmitting link)
//   corrupt    — outgoing tensor bytes get one flipped bit (a lying peer); header kept valid
//   disconnect — nothing goes out and nothing comes in (a vanished peer), per peer or for all;
//                liveness() then reports the peer kDisconnected since the cut (as ZmqTransport's
//                heartbeats would), and setDisconnectAfterSends(n) cuts everything after the n-th
//                further send (a node that dies in the middle of a collective, deterministically)
// Ownership: wraps and borrows the inner transport.
#pragma once

#include <atomic>
#include <mutex>
#include <map>

#include "node/transport/Transport.h"

namespace cairn {

class FaultyTransport : public Transport {
 public:
  explicit FaultyTransport(Transport& inner) : inner_(inner) {}

  // Probability in [0, 1] that a send is dropped; every `drop_every`-th send when set instead
  // (deterministic tests). Randomness is seeded (`seed`) so runs repeat.
  void setDropProbability(double p) { drop_probability_ = p; }
  void setDropEvery(int n) { drop_every_ = n; }
  void setDelay(std::chrono::milliseconds d) { delay_ms_ = static_cast<int>(d.count()); }
  // Bytes per second; 0: off.
  void setBandwidth(double bytes_per_second) { bytes_per_second_ = bytes_per_second; }
  void setDuplicate(bool on) { duplicate_ = on; }
  void setCorrupt(bool on) { corrupt_ = on; }
  // Cut the link to one peer (both directions: its messages are discarded on receive), or all.
  void disconnect(const std::string& peer);
  void disconnectAll(bool on);
  void reconnect(const std::string& peer);
  // After `sends` more sends (counting from this call), behave as disconnectAll(true). 0: off.
  void setDisconnectAfterSends(uint64_t sends);
  void setSeed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(rng_mutex_);
    rng_state_ = seed | 1;
  }

  uint64_t dropped() const { return dropped_; }
  uint64_t duplicated() const { return duplicated_; }
  uint64_t corrupted() const { return corrupted_; }

  const std::string& name() const override { return inner_.name(); }
  void addPeer(const std::string& peer, const std::string& endpoint) override {
    inner_.addPeer(peer, endpoint);
  }
  [[nodiscard]] SendStatus send(const std::string& peer, const Message& message,
                                std::chrono::milliseconds timeout) override;
  [[nodiscard]] std::optional<Message> receive(std::chrono::milliseconds timeout) override;
  TransportStats stats() const override { return inner_.stats(); }
  PeerLiveness liveness(const std::string& peer) const override;
  void flushAndClose(std::chrono::milliseconds timeout) override { inner_.flushAndClose(timeout); }
  void redial(const std::string& peer) override { inner_.redial(peer); }

 private:
  bool isCut(const std::string& peer) const;
  double uniform();  // xorshift64*: deterministic, no global state

  Transport& inner_;
  std::atomic<double> drop_probability_{0};
  std::atomic<int> drop_every_{0};
  std::atomic<int> delay_ms_{0};
  std::atomic<double> bytes_per_second_{0};
  std::atomic<bool> duplicate_{false}, corrupt_{false}, disconnect_all_{false};
  mutable std::mutex cut_mutex_;
  std::map<std::string, std::chrono::steady_clock::time_point> cut_peers_;  // peer → since
  std::chrono::steady_clock::time_point all_cut_since_{};
  std::atomic<uint64_t> disconnect_at_send_{0};
  std::mutex rng_mutex_;
  uint64_t rng_state_ = 0x9E3779B97F4A7C15ull;  // under rng_mutex_
  std::atomic<uint64_t> sends_{0};
  std::atomic<uint64_t> dropped_{0}, duplicated_{0}, corrupted_{0};
};

}  // namespace cairn
