// A hostile relay, for tests only (RelayOptions::test_tamper_seed; `provider --relay` under
// CAIRN_TEST_RELAY_TAMPER): what a relay could do to the sealed messages it forwards — drop,
// flip, duplicate, reorder — drawn from a seed, so that a test sees the end-to-end layer
// (RelaySeal.h, RelayedLinks.h) refuse and recover every kind, and the training change by nothing.
#include "core/Log.h"
#include "node/transport/RelayLoop.h"

namespace cairn {
namespace {

// splitmix64: a tiny seeded generator, the same sequence on every machine.
uint64_t nextTamperDraw(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

zmq::message_t copyOf(const zmq::message_t& frame) { return zmq::message_t(frame.data(), frame.size()); }

}  // namespace

bool RelayLoop::tamper(const Link& link, Waiting& message) {
  if (tamper_state_ == 0) tamper_state_ = options_.test_tamper_seed;
  const uint64_t draw = nextTamperDraw(tamper_state_);
  const uint64_t kind = draw % 32;
  if (kind > 3 || message.payload.empty()) return true;
  count(&RelayStats::tampered);
  static const char* const kKinds[] = {"dropped", "flipped a bit in", "doubled", "held back"};
  if (++tampered_logged_ <= 3 || tampered_logged_ % 100 == 0)
    CAIRN_WARN("relay: tampered with a message of ", link.first, " → ", link.second, " (",
               kKinds[kind], " it; ", tampered_logged_, " so far, CAIRN_TEST_RELAY_TAMPER)");
  if (kind == 0) return false;  // dropped
  if (kind == 1) {              // a bit flipped in one payload frame
    zmq::message_t& frame = message.payload[(draw >> 8) % message.payload.size()];
    if (frame.size() > 0) static_cast<unsigned char*>(frame.data())[(draw >> 16) % frame.size()] ^= 0x10;
    return true;
  }
  if (kind == 2) {  // goes twice: a copy right behind it
    Waiting copy;
    for (const zmq::message_t& frame : message.payload) copy.payload.push_back(copyOf(frame));
    copy.bytes = message.bytes;
    copy.cost = message.cost;
    held_.emplace_back(link, std::move(copy));
    return true;
  }
  held_.emplace_back(link, std::move(message));  // held: goes after the next message taken
  return false;
}

}  // namespace cairn
