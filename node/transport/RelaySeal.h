// The end-to-end seal of a relayed link: two volunteers whose link runs through a relay (a third
// machine forwarding ZeroMQ frames). CurveZMQ ends at each hop, so the relay reads every frame in
// clear; this inner layer seals each message between the two volunteers with their own CURVE key
// pairs (Curve25519, the same keys CurveZMQ uses), so the relay can forward frames but can neither
// read, forge, replay, reorder nor reflect them unnoticed.
//
// Sealed frame (one per frame of the message; all integers little-endian):
//
//   offset  size  field
//    0       8    session      random per (re)start of the sending side (LinkSealer::restart)
//    8       8    sequence     0, 1, 2, ... per message within the session
//   16       4    frame index  0 .. count-1
//   20       4    frame count  bits 0-29: the message's number of frames; bit 30: a control
//                                frame (below); bit 31: the direction
//   24      16    MAC          crypto_box_easy_afternm's output: Poly1305 tag ...
//   40       n    ciphertext   ... then the frame's n bytes, XSalsa20-encrypted
//
// The first 24 bytes are the box's nonce, sent in clear: a relay changing any of them makes the
// MAC fail. The key is crypto_box_beforenm(peer public key, own secret key), computed once per
// peer. Each (session, sequence, index) is used once, so no nonce repeats under one key.
//
// Direction: crypto_box's shared key is the same both ways (A→B and B→A), so a relay could send A
// its own message back. Bit 31 of the frame-count field says which way a frame goes: it is set by
// the side whose public key is smaller (the two 32-byte keys as decoded from Z85, compared
// byte-wise as unsigned, i.e. memcmp) and clear from the other; an opener refuses a frame carrying
// its own side's bit (kForged). A node cannot have a relayed link to its own key (BadInput).
//
// Acceptance (LinkOpener::open, per message, checked in this order; no state changes unless the
// whole message is taken):
//   kMalformed  a frame shorter than 40 bytes, frames disagreeing on session, sequence or the
//               count field, an index out of order, a count other than the frames received;
//   kForged     this node's own direction bit (reflected), or any frame's MAC fails (sealed by
//               another key, for another peer, or changed on the way);
//   kOpened     the current session and the next sequence, or a session never seen from this
//               peer at sequence 0 (the sender restarted: it becomes the current session);
//   kReplayed   the current session at a sequence already taken, or any earlier session (every
//               session ever taken is remembered, so an old one cannot be replayed from its start);
//   kOutOfOrder the current session past the next sequence (a message dropped or reordered), or
//               a new session not at sequence 0.
// A refused message is dropped whole; what the link does next is the transport's (kOutOfOrder
// means messages were lost: the sender's restart() resumes the link; the others are a relay's or
// a stranger's traffic, to count and drop). A receiver starts with no session: it takes a sender's
// session only from its sequence 0, so a receiver that started afresh needs the sender to restart.
//
// Control frames (ControlSealer / ControlOpener): the relayed link's acknowledgements and requests
// to resend (node/transport/RelayedLinks.h), one frame each, sealed the same way with bit 30 of the
// count field set (a count of 1), in their own session and sequence, so a relay can turn neither a
// data frame into a control frame nor one into the other. Their order is loose — a control frame
// may be lost, so an opener takes any sequence above the last it took in the current session, and
// any sequence of a session never seen (the peer restarted) — but none is taken twice and no
// earlier session's is taken at all.
//
// Hand-written because libsodium gives the box, not a sequenced channel. crypto_secretstream
// is not strictly better here: its state advances on every push (no cancelLast without copying
// it), a dropped or reordered message shows only as a failed MAC (no kOutOfOrder apart from
// kForged), it needs a key per direction derived first (crypto_kx), and a receiver taking a new
// stream header still has to remember every header to refuse an old stream replayed from its
// start — which is what this layer does with sessions anyway.
//
// Thread-safety: none; each object belongs to the thread that sends (LinkSealer) or receives
// (LinkOpener) on its link. Keys are wiped when an object is destroyed.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>
#include <zmq.hpp>

#include "core/CurveKeys.h"

namespace cairn {

// Bytes a sealed frame adds to its plaintext: the nonce (24) and the MAC (16).
inline constexpr size_t kSealNonceBytes = 24;
inline constexpr size_t kSealOverheadBytes = 40;
// Bit 31 of the frame-count field: the direction (above).
inline constexpr uint32_t kSealDirectionBit = 0x80000000u;
// Bit 30 of the frame-count field: a control frame (ControlSealer below), never part of a message.
inline constexpr uint32_t kSealControlBit = 0x40000000u;

// The precomputed key of one pair of nodes, and the direction bits of their two sides.
// BadInput naming what is wrong: a key that is not 40 Z85 characters, a secret key that does not
// belong to the public key, the peer's key equal to this node's, a peer key libsodium refuses.
struct RelayPairKey {
  RelayPairKey(const CurveKeyPair& own, const std::string& peer_public_key_z85);
  ~RelayPairKey();
  RelayPairKey(const RelayPairKey&) = default;
  RelayPairKey& operator=(const RelayPairKey&) = default;

  std::array<unsigned char, 32> key{};  // crypto_box_beforenm's shared key
  uint32_t own_direction = 0;           // kSealDirectionBit or 0: what this node's frames carry
  uint32_t peer_direction = 0;          // the other one
};

// One direction of one relayed link: this node → peer.
class LinkSealer {
 public:
  // BadInput naming what is wrong for a malformed key (RelayPairKey).
  LinkSealer(const CurveKeyPair& own, const std::string& peer_public_key_z85);
  // Seals every frame of one message: returns one sealed frame per input frame. Advances the
  // sequence number by one (one message = one sequence number). A message has 1 to 2^30-1 frames.
  std::vector<zmq::message_t> seal(const std::vector<zmq::message_t>& frames);
  // The same at a sequence number the caller keeps (state unchanged): a message sealed again at
  // its own sequence in the same session gives the same bytes (a resend reuses its nonce for the
  // same plaintext only). The caller must never seal two different messages at one sequence.
  std::vector<zmq::message_t> sealAt(const std::vector<zmq::message_t>& frames,
                                     uint64_t sequence) const;
  // Frames this side sealed (any session) sealed again in the current session at `sequence`:
  // what waited unacknowledged when the peer restarted, sent to its successor.
  std::vector<zmq::message_t> resealAt(const std::vector<zmq::message_t>& sealed,
                                       uint64_t sequence) const;
  // The last seal() was never sent (the send timed out): its sequence number is used again.
  // Only when no frame of it can have left this node (ZeroMQ refused its first frame): the next
  // seal() uses the same nonces for other bytes, which must never both be seen. When in doubt,
  // send the same sealed frames again later, or restart(). InternalError without a seal() to undo.
  void cancelLast();
  // A new session: a fresh random 64-bit session id (randombytes_buf), sequence 0. Called when the
  // link is (re)established (a new connection to a relay, the receiver asked for it).
  void restart();
  uint64_t session() const;
  uint64_t nextSequence() const;

 private:
  RelayPairKey pair_;
  uint64_t session_ = 0;
  uint64_t next_ = 0;
  bool can_cancel_ = false;
};

// The other direction: peer → this node.
class LinkOpener {
 public:
  LinkOpener(const CurveKeyPair& own, const std::string& peer_public_key_z85);
  enum class Opened { kOpened, kForged, kReplayed, kOutOfOrder, kMalformed };
  // Opens one message's sealed frames in place (plaintext on kOpened; untouched otherwise) and
  // says why it refused in *why (one sentence naming what was wrong; why may be null). Refuses
  // the WHOLE message when any frame fails.
  Opened open(std::vector<zmq::message_t>& frames, std::string* why);
  // Counters for metrics: messages opened, messages refused.
  uint64_t opened() const;
  uint64_t refused() const;
  // What it expects next: the current session (0 before any) and its next sequence.
  uint64_t expectedSession() const;
  uint64_t expectedSequence() const;
  // Whether a message of `session` was ever taken.
  bool knowsSession(uint64_t session) const;

 private:
  struct Header {
    uint64_t session = 0;
    uint64_t sequence = 0;
    uint32_t count_field = 0;  // with the direction bit
  };
  Opened checkFrames(const std::vector<zmq::message_t>& frames, Header* header,
                     std::string* why) const;
  Opened checkOrder(const Header& header, std::string* why) const;
  Opened refuse(Opened verdict);

  RelayPairKey pair_;
  bool has_session_ = false;
  uint64_t session_ = 0;
  uint64_t expected_ = 0;
  std::unordered_set<uint64_t> seen_sessions_;
  uint64_t opened_ = 0;
  uint64_t refused_ = 0;
};

// "opened", "forged", "replayed", "out_of_order", "malformed" (metric labels).
const char* openedName(LinkOpener::Opened);

// A sealed frame's session and sequence as it says (not authenticated: to ask for a resend only);
// false when it is too short to be one.
bool peekSealed(const zmq::message_t& frame, uint64_t* session, uint64_t* sequence);
// Whether a frame says it is a control frame (bit 30; authenticated only by ControlOpener::open).
bool isSealedControl(const zmq::message_t& frame);

// One node's control frames to a peer: a random session per object, sequence 0, 1, 2, ...
class ControlSealer {
 public:
  ControlSealer(const CurveKeyPair& own, const std::string& peer_public_key_z85);
  zmq::message_t seal(const std::string& payload);

 private:
  RelayPairKey pair_;
  uint64_t session_ = 0;
  uint64_t next_ = 0;
};

// A peer's control frames: false (and *why) for one that is not sealed by the peer for this node,
// carries this node's direction, was taken before or belongs to an earlier session.
class ControlOpener {
 public:
  ControlOpener(const CurveKeyPair& own, const std::string& peer_public_key_z85);
  bool open(const zmq::message_t& frame, std::string* payload, std::string* why);

 private:
  RelayPairKey pair_;
  bool has_session_ = false;
  uint64_t session_ = 0;
  uint64_t last_ = 0;
  std::unordered_set<uint64_t> seen_sessions_;
};

}  // namespace cairn
