#include "node/transport/RelaySeal.h"

#include <sodium.h>
#include <zmq.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/Error.h"

namespace cairn {
namespace {

void relayInitSodiumOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (sodium_init() < 0)
      CAIRN_THROW(InternalError, "libsodium failed to initialise (sodium_init)");
  });
}

// The 32 bytes of a Z85 key; BadInput naming `what` when it is not one.
std::array<unsigned char, 32> decodeRelayKey(const std::string& z85, const char* what) {
  if (!isZ85Key(z85))
    CAIRN_THROW(BadInput, "relay seal: ", what, " is not a CURVE key (40 Z85 characters), it has ",
                z85.size(), " characters");
  std::array<unsigned char, 32> raw{};
  if (zmq_z85_decode(raw.data(), z85.c_str()) == nullptr)
    CAIRN_THROW(BadInput, "relay seal: ", what, " does not decode as Z85");
  return raw;
}

void relayPutLe64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void relayPutLe32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t relayGetLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint32_t relayGetLe32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

const unsigned char* relayFrameBytes(const zmq::message_t& frame) {
  return static_cast<const unsigned char*>(frame.data());
}

std::string relaySessionHex(uint64_t session) {
  char text[20];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(session));
  return text;
}

// One sealed frame: the nonce (session, sequence, index, count field), then the box, sealed
// straight into the frame (the nonce, bytes 0-23, and the box, from 24 on, do not overlap).
zmq::message_t sealRelayFrame(const RelayPairKey& pair, uint64_t session, uint64_t sequence,
                              uint32_t index, uint32_t count_field, const unsigned char* plain,
                              size_t size) {
  zmq::message_t out(kSealOverheadBytes + size);
  auto* bytes = static_cast<unsigned char*>(out.data());
  relayPutLe64(bytes, session);
  relayPutLe64(bytes + 8, sequence);
  relayPutLe32(bytes + 16, index);
  relayPutLe32(bytes + 20, count_field);
  const int boxed = crypto_box_easy_afternm(bytes + kSealNonceBytes, plain, size, bytes, pair.key.data());
  CAIRN_ENFORCE(boxed == 0, "crypto_box_easy_afternm refused a frame of ", size, " bytes");
  return out;
}

}  // namespace

RelayPairKey::RelayPairKey(const CurveKeyPair& own, const std::string& peer_public_key_z85) {
  relayInitSodiumOnce();
  const auto own_public = decodeRelayKey(own.public_key, "this node's public key");
  auto own_secret = decodeRelayKey(own.secret_key, "this node's secret key");
  const auto peer_public = decodeRelayKey(peer_public_key_z85, "the peer's public key");
  std::array<unsigned char, 32> derived{};
  const bool derived_ok = crypto_scalarmult_base(derived.data(), own_secret.data()) == 0;
  if (!derived_ok || sodium_memcmp(derived.data(), own_public.data(), derived.size()) != 0) {
    sodium_memzero(own_secret.data(), own_secret.size());
    CAIRN_THROW(BadInput, "relay seal: this node's secret key does not belong to its public key ",
                own.public_key);
  }
  const int order = std::memcmp(own_public.data(), peer_public.data(), own_public.size());
  if (order == 0) {
    sodium_memzero(own_secret.data(), own_secret.size());
    CAIRN_THROW(BadInput, "relay seal: the peer's public key ", peer_public_key_z85,
                " is this node's own (a relayed link joins two different nodes)");
  }
  const int made = crypto_box_beforenm(key.data(), peer_public.data(), own_secret.data());
  sodium_memzero(own_secret.data(), own_secret.size());
  if (made != 0)
    CAIRN_THROW(BadInput, "relay seal: the peer's public key ", peer_public_key_z85,
                " is not a usable Curve25519 point (libsodium refuses it)");
  own_direction = order < 0 ? kSealDirectionBit : 0;
  peer_direction = order < 0 ? 0 : kSealDirectionBit;
}

RelayPairKey::~RelayPairKey() { sodium_memzero(key.data(), key.size()); }

LinkSealer::LinkSealer(const CurveKeyPair& own, const std::string& peer_public_key_z85)
    : pair_(own, peer_public_key_z85) {
  restart();
}

std::vector<zmq::message_t> LinkSealer::sealAt(const std::vector<zmq::message_t>& frames,
                                               uint64_t sequence) const {
  CAIRN_ENFORCE(!frames.empty() && frames.size() < kSealControlBit,
                "a sealed message has 1 to 2^30-1 frames, not ", frames.size());
  const uint32_t count_field = static_cast<uint32_t>(frames.size()) | pair_.own_direction;
  std::vector<zmq::message_t> sealed;
  sealed.reserve(frames.size());
  for (size_t i = 0; i < frames.size(); ++i)
    sealed.push_back(sealRelayFrame(pair_, session_, sequence, static_cast<uint32_t>(i), count_field,
                                    relayFrameBytes(frames[i]), frames[i].size()));
  return sealed;
}

std::vector<zmq::message_t> LinkSealer::resealAt(const std::vector<zmq::message_t>& sealed,
                                                 uint64_t sequence) const {
  std::vector<zmq::message_t> plain;
  plain.reserve(sealed.size());
  for (const zmq::message_t& frame : sealed) {
    CAIRN_ENFORCE(frame.size() >= kSealOverheadBytes, "resealAt: not a sealed frame");
    const unsigned char* bytes = relayFrameBytes(frame);
    zmq::message_t out(frame.size() - kSealOverheadBytes);
    // The shared key opens this side's own boxes as well as the peer's.
    const int opened = crypto_box_open_easy_afternm(static_cast<unsigned char*>(out.data()),
                                                    bytes + kSealNonceBytes,
                                                    frame.size() - kSealNonceBytes, bytes,
                                                    pair_.key.data());
    CAIRN_ENFORCE(opened == 0, "resealAt: a frame this node sealed does not open");
    plain.push_back(std::move(out));
  }
  return sealAt(plain, sequence);
}

std::vector<zmq::message_t> LinkSealer::seal(const std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> sealed = sealAt(frames, next_);
  ++next_;
  can_cancel_ = true;
  return sealed;
}

void LinkSealer::cancelLast() {
  CAIRN_ENFORCE(can_cancel_,
                "cancelLast() without a seal() to undo since the last restart or cancel");
  --next_;
  can_cancel_ = false;
}

void LinkSealer::restart() {
  randombytes_buf(&session_, sizeof session_);
  next_ = 0;
  can_cancel_ = false;
}

uint64_t LinkSealer::session() const { return session_; }
uint64_t LinkSealer::nextSequence() const { return next_; }

LinkOpener::LinkOpener(const CurveKeyPair& own, const std::string& peer_public_key_z85)
    : pair_(own, peer_public_key_z85) {}

LinkOpener::Opened LinkOpener::checkFrames(const std::vector<zmq::message_t>& frames,
                                           Header* header, std::string* why) const {
  if (frames.empty()) {
    if (why) *why = "the message has no frames.";
    return Opened::kMalformed;
  }
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].size() < kSealOverheadBytes) {
      if (why)
        *why = "frame " + std::to_string(i) + " has " + std::to_string(frames[i].size()) +
               " bytes, fewer than a sealed frame's 40 (nonce and MAC).";
      return Opened::kMalformed;
    }
    const unsigned char* bytes = relayFrameBytes(frames[i]);
    const Header h{relayGetLe64(bytes), relayGetLe64(bytes + 8), relayGetLe32(bytes + 20)};
    if (i == 0) *header = h;
    if (h.session != header->session || h.sequence != header->sequence ||
        h.count_field != header->count_field) {
      if (why)
        *why = "frame " + std::to_string(i) +
               " names another session, sequence or frame count than frame 0 (frames of two "
               "messages).";
      return Opened::kMalformed;
    }
    if (relayGetLe32(bytes + 16) != i) {
      if (why)
        *why = "frame " + std::to_string(i) + " carries frame index " +
               std::to_string(relayGetLe32(bytes + 16)) + " (frames dropped or reordered).";
      return Opened::kMalformed;
    }
  }
  if (header->count_field & kSealControlBit) {
    if (why) *why = "a control frame among a message's frames.";
    return Opened::kMalformed;
  }
  const uint32_t count = header->count_field & ~kSealDirectionBit;
  if (count != frames.size()) {
    if (why)
      *why = "the message says it has " + std::to_string(count) + " frames but " +
             std::to_string(frames.size()) + " arrived.";
    return Opened::kMalformed;
  }
  if ((header->count_field & kSealDirectionBit) != pair_.peer_direction) {
    if (why)
      *why = "the message carries this node's own direction bit: one it sealed, sent back to it.";
    return Opened::kForged;
  }
  return Opened::kOpened;
}

LinkOpener::Opened LinkOpener::checkOrder(const Header& header, std::string* why) const {
  const auto say = [&](const std::string& what) {
    if (why)
      *why = "sequence " + std::to_string(header.sequence) + " of session " +
             relaySessionHex(header.session) + what;
  };
  if (has_session_ && header.session == session_) {
    if (header.sequence == expected_) return Opened::kOpened;
    const bool behind = header.sequence < expected_;
    say(" while " + std::to_string(expected_) + " is expected next (" +
        (behind ? "a duplicate or a replay)." : "a message dropped or reordered)."));
    return behind ? Opened::kReplayed : Opened::kOutOfOrder;
  }
  if (seen_sessions_.count(header.session)) {
    say(": an earlier session of this peer, replayed.");
    return Opened::kReplayed;
  }
  if (header.sequence == 0) return Opened::kOpened;
  say(": a new session must start at sequence 0 (its first messages were lost).");
  return Opened::kOutOfOrder;
}

LinkOpener::Opened LinkOpener::refuse(Opened verdict) {
  ++refused_;
  return verdict;
}

LinkOpener::Opened LinkOpener::open(std::vector<zmq::message_t>& frames, std::string* why) {
  Header header;
  const Opened framing = checkFrames(frames, &header, why);
  if (framing != Opened::kOpened) return refuse(framing);
  // Every MAC before any order check: a changed nonce reads as forged, never as a replay.
  std::vector<zmq::message_t> plain;
  plain.reserve(frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    const unsigned char* bytes = relayFrameBytes(frames[i]);
    zmq::message_t out(frames[i].size() - kSealOverheadBytes);
    if (crypto_box_open_easy_afternm(static_cast<unsigned char*>(out.data()),
                                     bytes + kSealNonceBytes, frames[i].size() - kSealNonceBytes,
                                     bytes, pair_.key.data()) != 0) {
      if (why)
        *why =
            "frame " + std::to_string(i) +
            "'s MAC does not verify: not sealed by this peer for this node, or changed on the way.";
      return refuse(Opened::kForged);
    }
    plain.push_back(std::move(out));
  }
  const Opened order = checkOrder(header, why);
  if (order != Opened::kOpened) return refuse(order);
  if (!has_session_ || header.session != session_) {
    has_session_ = true;
    session_ = header.session;
    seen_sessions_.insert(header.session);
  }
  expected_ = header.sequence + 1;
  frames.swap(plain);
  ++opened_;
  return Opened::kOpened;
}

uint64_t LinkOpener::opened() const { return opened_; }
uint64_t LinkOpener::expectedSession() const { return has_session_ ? session_ : 0; }
uint64_t LinkOpener::expectedSequence() const { return has_session_ ? expected_ : 0; }
bool LinkOpener::knowsSession(uint64_t session) const { return seen_sessions_.count(session) > 0; }

bool peekSealed(const zmq::message_t& frame, uint64_t* session, uint64_t* sequence) {
  if (frame.size() < kSealOverheadBytes) return false;
  *session = relayGetLe64(relayFrameBytes(frame));
  *sequence = relayGetLe64(relayFrameBytes(frame) + 8);
  return true;
}

bool isSealedControl(const zmq::message_t& frame) {
  return frame.size() >= kSealOverheadBytes &&
         (relayGetLe32(relayFrameBytes(frame) + 20) & kSealControlBit) != 0;
}

ControlSealer::ControlSealer(const CurveKeyPair& own, const std::string& peer_public_key_z85)
    : pair_(own, peer_public_key_z85) {
  randombytes_buf(&session_, sizeof session_);
}

zmq::message_t ControlSealer::seal(const std::string& payload) {
  const uint32_t count_field = 1u | kSealControlBit | pair_.own_direction;
  return sealRelayFrame(pair_, session_, next_++, 0, count_field,
                        reinterpret_cast<const unsigned char*>(payload.data()), payload.size());
}

ControlOpener::ControlOpener(const CurveKeyPair& own, const std::string& peer_public_key_z85)
    : pair_(own, peer_public_key_z85) {}

bool ControlOpener::open(const zmq::message_t& frame, std::string* payload, std::string* why) {
  const auto no = [&](const char* what) {
    if (why) *why = what;
    return false;
  };
  if (frame.size() < kSealOverheadBytes) return no("a control frame shorter than 40 bytes.");
  const unsigned char* bytes = relayFrameBytes(frame);
  const uint64_t session = relayGetLe64(bytes), sequence = relayGetLe64(bytes + 8);
  const uint32_t count_field = relayGetLe32(bytes + 20);
  if (relayGetLe32(bytes + 16) != 0 || (count_field & ~(kSealDirectionBit | kSealControlBit)) != 1 ||
      !(count_field & kSealControlBit))
    return no("not a control frame (index 0 of 1, the control bit).");
  if ((count_field & kSealDirectionBit) != pair_.peer_direction)
    return no("a control frame carrying this node's own direction bit (sent back to it).");
  std::string plain(frame.size() - kSealOverheadBytes, '\0');
  if (crypto_box_open_easy_afternm(reinterpret_cast<unsigned char*>(plain.data()),
                                   bytes + kSealNonceBytes, frame.size() - kSealNonceBytes, bytes,
                                   pair_.key.data()) != 0)
    return no("a control frame whose MAC does not verify.");
  if (has_session_ && session == session_) {
    if (sequence <= last_) return no("a control frame replayed (its sequence was taken).");
  } else if (seen_sessions_.count(session)) {
    return no("a control frame of an earlier session, replayed.");
  } else {
    has_session_ = true;
    session_ = session;
    seen_sessions_.insert(session);
  }
  last_ = sequence;
  *payload = std::move(plain);
  return true;
}
uint64_t LinkOpener::refused() const { return refused_; }

const char* openedName(LinkOpener::Opened opened) {
  switch (opened) {
    case LinkOpener::Opened::kOpened:
      return "opened";
    case LinkOpener::Opened::kForged:
      return "forged";
    case LinkOpener::Opened::kReplayed:
      return "replayed";
    case LinkOpener::Opened::kOutOfOrder:
      return "out_of_order";
    case LinkOpener::Opened::kMalformed:
      return "malformed";
  }
  return "unknown";
}

}  // namespace cairn
