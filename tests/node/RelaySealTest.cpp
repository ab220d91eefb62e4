// The end-to-end seal of relayed links (node/transport/RelaySeal.h), against libsodium's plain
// crypto_box: sealed messages open to their bytes (a 1 MiB frame and empty frames included) and
// each sealed frame opens with crypto_box_open_easy from its own nonce prefix; every single-bit
// change, dropped, swapped or spliced frame, duplicate, reordered, dropped, reflected or
// misaddressed message and an old session replayed after a restart is refused as the header says,
// and leaves the opener taking the next correctly sequenced message.
#include <gtest/gtest.h>
#include <sodium.h>
#include <zmq.h>

#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "node/transport/RelaySeal.h"

namespace cairn {
namespace {

std::vector<zmq::message_t> sealTestFrames(const std::vector<std::string>& parts) {
  std::vector<zmq::message_t> frames;
  for (const auto& part : parts) frames.emplace_back(part.data(), part.size());
  return frames;
}

std::vector<std::string> sealTestBytes(const std::vector<zmq::message_t>& frames) {
  std::vector<std::string> parts;
  for (const auto& frame : frames) parts.emplace_back(frame.data<char>(), frame.size());
  return parts;
}

std::vector<zmq::message_t> sealTestCopy(const std::vector<zmq::message_t>& frames) {
  std::vector<zmq::message_t> copy;
  for (const auto& frame : frames) copy.emplace_back(frame.data(), frame.size());
  return copy;
}

std::string sealTestRandom(size_t size, unsigned seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (auto& byte : bytes) byte = static_cast<char>(random() & 0xff);
  return bytes;
}

std::array<unsigned char, 32> sealTestRawKey(const std::string& z85) {
  std::array<unsigned char, 32> raw{};
  EXPECT_NE(zmq_z85_decode(raw.data(), z85.c_str()), nullptr) << z85;
  return raw;
}

uint64_t sealTestLe(const unsigned char* bytes, int size) {
  uint64_t value = 0;
  for (int i = 0; i < size; ++i) value |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return value;
}

// Opens a copy of `sealed` and names the outcome; on kOpened, checks the plaintext is `expected`.
// On a refusal, checks the frames were left as they came.
std::string sealTestOpen(LinkOpener& opener, const std::vector<zmq::message_t>& sealed,
                         const std::vector<std::string>& expected = {}) {
  std::vector<zmq::message_t> frames = sealTestCopy(sealed);
  std::string why;
  const LinkOpener::Opened opened = opener.open(frames, &why);
  if (opened == LinkOpener::Opened::kOpened) {
    EXPECT_TRUE(why.empty()) << why;
    EXPECT_EQ(sealTestBytes(frames), expected);
  } else {
    EXPECT_FALSE(why.empty()) << openedName(opened);
    EXPECT_EQ(sealTestBytes(frames), sealTestBytes(sealed)) << "a refused message was changed";
  }
  return openedName(opened);
}

// A (sender, receiver) pair and its two ends of one direction.
struct SealTestLink {
  CurveKeyPair sender = generateCurveKeyPair();
  CurveKeyPair receiver = generateCurveKeyPair();
  LinkSealer sealer{sender, receiver.public_key};
  LinkOpener opener{receiver, sender.public_key};
};

TEST(RelaySeal, MultiFrameMessagesRoundTripByteForByte) {
  SealTestLink link;
  const std::string big = sealTestRandom(1 << 20, 1);
  const std::vector<std::vector<std::string>> messages = {
      {""}, {"x"}, {"", sealTestRandom(1000, 2), ""}, {big, "tail", ""}, {sealTestRandom(57, 3)}};
  for (const auto& message : messages) {
    const auto sealed = link.sealer.seal(sealTestFrames(message));
    ASSERT_EQ(sealed.size(), message.size());
    for (size_t i = 0; i < sealed.size(); ++i)
      EXPECT_EQ(sealed[i].size(), message[i].size() + kSealOverheadBytes);
    EXPECT_EQ(sealTestOpen(link.opener, sealed, message), "opened");
  }
  // The 1 MiB frame went out encrypted, not in clear.
  const auto sealed = link.sealer.seal(sealTestFrames({big}));
  EXPECT_EQ(
      std::string(sealed[0].data<char>() + kSealOverheadBytes, big.size()).find(big.substr(0, 64)),
      std::string::npos);
  EXPECT_EQ(link.opener.opened(), messages.size());
  EXPECT_EQ(link.opener.refused(), 0u);
}

// The format, read independently: the nonce prefix's fields and libsodium's one-shot box.
TEST(RelaySeal, SealedFramesOpenWithPlainCryptoBox) {
  ASSERT_GE(sodium_init(), 0);
  const CurveKeyPair a = generateCurveKeyPair(), b = generateCurveKeyPair();
  for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}}) {
    LinkSealer sealer(from, to.public_key);
    sealer.seal(sealTestFrames({"first message"}));
    const std::vector<std::string> message = {"frame zero", "", sealTestRandom(4096, 4)};
    const auto sealed = sealer.seal(sealTestFrames(message));
    const auto from_public = sealTestRawKey(from.public_key);
    const auto to_secret = sealTestRawKey(to.secret_key);
    const bool smaller =
        std::memcmp(from_public.data(), sealTestRawKey(to.public_key).data(), 32) < 0;
    for (size_t i = 0; i < sealed.size(); ++i) {
      const auto* bytes = sealed[i].data<unsigned char>();
      EXPECT_EQ(sealTestLe(bytes, 8), sealer.session());
      EXPECT_EQ(sealTestLe(bytes + 8, 8), 1u);
      EXPECT_EQ(sealTestLe(bytes + 16, 4), i);
      EXPECT_EQ(sealTestLe(bytes + 20, 4) & 0x7fffffffu, message.size());
      EXPECT_EQ((sealTestLe(bytes + 20, 4) >> 31) == 1, smaller);
      std::string plain(sealed[i].size() - 40, '\0');
      ASSERT_EQ(
          crypto_box_open_easy(reinterpret_cast<unsigned char*>(plain.data()), bytes + 24,
                               sealed[i].size() - 24, bytes, from_public.data(), to_secret.data()),
          0);
      EXPECT_EQ(plain, message[i]);
    }
  }
}

// What one flipped bit must give: the box or the session and sequence fail the MAC; in a message
// of several frames any nonce change sets the frame apart from the others; alone, a changed index
// or count is malformed and a changed direction bit reads as reflected.
std::string sealTestFlipVerdict(size_t frame_count, size_t position, int bit) {
  if (position >= 24) return "forged";
  if (frame_count > 1) return "malformed";
  if (position < 16) return "forged";
  return position == 23 && bit == 7 ? "forged" : "malformed";
}

TEST(RelaySeal, EveryFlippedBitIsRefusedAndLeavesTheOpenerAsItWas) {
  SealTestLink link;
  for (const std::vector<std::string>& message :
       {std::vector<std::string>{"abc"}, std::vector<std::string>{"", "seventeen bytes!!", "z"}}) {
    for (size_t frame = 0; frame < message.size(); ++frame) {
      for (size_t position = 0; position < message[frame].size() + kSealOverheadBytes; ++position) {
        for (int bit = 0; bit < 8; ++bit) {
          if (position >= 24 && bit != static_cast<int>(position % 8)) continue;
          const auto sealed = link.sealer.seal(sealTestFrames(message));
          auto tampered = sealTestCopy(sealed);
          tampered[frame].data<unsigned char>()[position] ^= static_cast<unsigned char>(1u << bit);
          ASSERT_EQ(sealTestOpen(link.opener, tampered),
                    sealTestFlipVerdict(message.size(), position, bit))
              << "frame " << frame << " byte " << position << " bit " << bit;
          ASSERT_EQ(sealTestOpen(link.opener, sealed, message), "opened")
              << "after frame " << frame << " byte " << position << " bit " << bit;
        }
      }
    }
  }
  EXPECT_EQ(link.opener.opened(), link.opener.refused());
}

TEST(RelaySeal, FramesDroppedSwappedOrSplicedAreMalformed) {
  SealTestLink link;
  const std::vector<std::string> message = {"zero", "one", "two"}, next = {"three", "four", "five"};
  const auto sealed = link.sealer.seal(sealTestFrames(message));
  const auto following = link.sealer.seal(sealTestFrames(next));
  const auto without = [&](size_t dropped) {
    std::vector<zmq::message_t> frames;
    for (size_t i = 0; i < sealed.size(); ++i)
      if (i != dropped) frames.emplace_back(sealed[i].data(), sealed[i].size());
    return frames;
  };
  EXPECT_EQ(sealTestOpen(link.opener, without(1)), "malformed");
  EXPECT_EQ(sealTestOpen(link.opener, without(2)), "malformed");  // indices fine, the count is not
  auto swapped = sealTestCopy(sealed);
  std::swap(swapped[0], swapped[2]);
  EXPECT_EQ(sealTestOpen(link.opener, swapped), "malformed");
  auto spliced = sealTestCopy(sealed);
  spliced[1] = zmq::message_t(following[1].data(), following[1].size());
  EXPECT_EQ(sealTestOpen(link.opener, spliced), "malformed");
  auto longer = sealTestCopy(sealed);
  longer.emplace_back(sealed[2].data(), sealed[2].size());
  EXPECT_EQ(sealTestOpen(link.opener, longer), "malformed");
  auto cut = sealTestCopy(sealed);
  cut[2] = zmq::message_t(sealed[2].data(), kSealOverheadBytes - 1);
  EXPECT_EQ(sealTestOpen(link.opener, cut), "malformed");
  EXPECT_EQ(sealTestOpen(link.opener, {}), "malformed");
  EXPECT_EQ(sealTestOpen(link.opener, sealed, message), "opened");
  EXPECT_EQ(sealTestOpen(link.opener, following, next), "opened");
  EXPECT_EQ(link.opener.refused(), 7u);
}

TEST(RelaySeal, DuplicatesAreReplayedAndGapsOutOfOrder) {
  SealTestLink link;
  std::vector<std::vector<std::string>> plain;
  std::vector<std::vector<zmq::message_t>> sealed;
  for (int m = 0; m < 7; ++m) {
    plain.push_back({"message " + std::to_string(m), sealTestRandom(m * 10, m)});
    sealed.push_back(link.sealer.seal(sealTestFrames(plain.back())));
  }
  EXPECT_EQ(sealTestOpen(link.opener, sealed[0], plain[0]), "opened");
  EXPECT_EQ(sealTestOpen(link.opener, sealed[0]), "replayed");      // duplicated
  EXPECT_EQ(sealTestOpen(link.opener, sealed[2]), "out_of_order");  // 1 and 2 swapped
  EXPECT_EQ(sealTestOpen(link.opener, sealed[1], plain[1]), "opened");
  EXPECT_EQ(sealTestOpen(link.opener, sealed[1]), "replayed");
  EXPECT_EQ(sealTestOpen(link.opener, sealed[0]), "replayed");
  EXPECT_EQ(sealTestOpen(link.opener, sealed[2], plain[2]), "opened");
  EXPECT_EQ(sealTestOpen(link.opener, sealed[4]), "out_of_order");  // 3 dropped
  EXPECT_EQ(sealTestOpen(link.opener, sealed[5]), "out_of_order");
  EXPECT_EQ(sealTestOpen(link.opener, sealed[3], plain[3]), "opened");  // it comes after all
  for (int m = 4; m < 7; ++m) EXPECT_EQ(sealTestOpen(link.opener, sealed[m], plain[m]), "opened");
  EXPECT_EQ(link.opener.opened(), 7u);
  EXPECT_EQ(link.opener.refused(), 6u);
}

TEST(RelaySeal, MessagesReflectedToTheirSenderAreForged) {
  const CurveKeyPair a = generateCurveKeyPair(), b = generateCurveKeyPair();
  // Both ways round, so both values of the direction bit are reflected.
  for (const auto& [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
    LinkSealer x_to_y(x, y.public_key), y_to_x(y, x.public_key);
    LinkOpener x_from_y(x, y.public_key), y_from_x(y, x.public_key);
    const auto own = x_to_y.seal(sealTestFrames({"x's own", "message"}));
    EXPECT_EQ(sealTestOpen(x_from_y, own), "forged");
    auto rebit = sealTestCopy(own);  // the relay flips the direction bit back: the MAC fails
    for (auto& frame : rebit) frame.data<unsigned char>()[23] ^= 0x80;
    EXPECT_EQ(sealTestOpen(x_from_y, rebit), "forged");
    EXPECT_EQ(sealTestOpen(x_from_y, y_to_x.seal(sealTestFrames({"from y"})), {"from y"}),
              "opened");
    EXPECT_EQ(sealTestOpen(y_from_x, own, {"x's own", "message"}), "opened");
  }
}

TEST(RelaySeal, MessagesSealedForAnotherPeerAreForged) {
  const CurveKeyPair a = generateCurveKeyPair(), b = generateCurveKeyPair(),
                     c = generateCurveKeyPair();
  LinkSealer a_to_c(a, c.public_key), c_to_b(c, b.public_key), a_to_b(a, b.public_key);
  LinkOpener b_from_a(b, a.public_key);
  EXPECT_EQ(sealTestOpen(b_from_a, a_to_c.seal(sealTestFrames({"for c"}))), "forged");
  EXPECT_EQ(sealTestOpen(b_from_a, c_to_b.seal(sealTestFrames({"c, not a"}))), "forged");
  EXPECT_EQ(sealTestOpen(b_from_a, a_to_b.seal(sealTestFrames({"for b"})), {"for b"}), "opened");
  EXPECT_EQ(b_from_a.opened(), 1u);
  EXPECT_EQ(b_from_a.refused(), 2u);
}

TEST(RelaySeal, AnOldSessionReplayedFromItsStartIsReplayed) {
  SealTestLink link;
  const auto first0 = link.sealer.seal(sealTestFrames({"first 0"}));
  const auto first1 = link.sealer.seal(sealTestFrames({"first 1"}));
  EXPECT_EQ(sealTestOpen(link.opener, first0, {"first 0"}), "opened");
  EXPECT_EQ(sealTestOpen(link.opener, first1, {"first 1"}), "opened");
  const uint64_t first_session = link.sealer.session();
  link.sealer.restart();
  EXPECT_NE(link.sealer.session(), first_session);
  const auto second0 = link.sealer.seal(sealTestFrames({"second 0"}));
  EXPECT_EQ(sealTestOpen(link.opener, second0, {"second 0"}), "opened");
  EXPECT_EQ(sealTestOpen(link.opener, first0), "replayed");
  EXPECT_EQ(sealTestOpen(link.opener, first1), "replayed");
  EXPECT_EQ(sealTestOpen(link.opener, link.sealer.seal(sealTestFrames({"second 1"})), {"second 1"}),
            "opened");
  link.sealer.restart();  // a new session whose first message is lost, then found late
  const auto third0 = link.sealer.seal(sealTestFrames({"third 0"}));
  const auto third1 = link.sealer.seal(sealTestFrames({"third 1"}));
  EXPECT_EQ(sealTestOpen(link.opener, third1), "out_of_order");
  EXPECT_EQ(sealTestOpen(link.opener, third0, {"third 0"}), "opened");
  EXPECT_EQ(sealTestOpen(link.opener, second0), "replayed");
  EXPECT_EQ(sealTestOpen(link.opener, first0), "replayed");
  EXPECT_EQ(sealTestOpen(link.opener, third1, {"third 1"}), "opened");
}

TEST(RelaySeal, CancelLastReusesTheSequence) {
  SealTestLink link;
  EXPECT_EQ(sealTestOpen(link.opener, link.sealer.seal(sealTestFrames({"0"})), {"0"}), "opened");
  const uint64_t session = link.sealer.session();
  link.sealer.seal(sealTestFrames({"never sent"}));
  EXPECT_EQ(link.sealer.nextSequence(), 2u);
  link.sealer.cancelLast();
  EXPECT_EQ(link.sealer.nextSequence(), 1u);
  EXPECT_THROW(link.sealer.cancelLast(), InternalError);  // one seal() undone at most
  const auto resent = link.sealer.seal(sealTestFrames({"1 after all"}));
  EXPECT_EQ(sealTestLe(resent[0].data<unsigned char>() + 8, 8), 1u);
  EXPECT_EQ(link.sealer.session(), session);
  EXPECT_EQ(sealTestOpen(link.opener, resent, {"1 after all"}), "opened");
  link.sealer.seal(sealTestFrames({"2"}));
  link.sealer.restart();
  EXPECT_THROW(link.sealer.cancelLast(), InternalError);  // nothing of the new session to undo
}

TEST(RelaySeal, RestartStartsASessionTheOpenerTakes) {
  SealTestLink link;
  EXPECT_EQ(sealTestOpen(link.opener, link.sealer.seal(sealTestFrames({"0"})), {"0"}), "opened");
  link.sealer.seal(sealTestFrames({"1, lost for good"}));
  EXPECT_EQ(sealTestOpen(link.opener, link.sealer.seal(sealTestFrames({"2"}))), "out_of_order");
  const uint64_t before = link.sealer.session();
  link.sealer.restart();  // the receiver asked for it
  EXPECT_NE(link.sealer.session(), before);
  EXPECT_EQ(link.sealer.nextSequence(), 0u);
  EXPECT_EQ(sealTestOpen(link.opener, link.sealer.seal(sealTestFrames({"new 0"})), {"new 0"}),
            "opened");
  EXPECT_EQ(sealTestOpen(link.opener, link.sealer.seal(sealTestFrames({"new 1"})), {"new 1"}),
            "opened");
  // A receiver that restarted itself takes a sender's session only from its start.
  LinkOpener fresh(link.receiver, link.sender.public_key);
  EXPECT_EQ(sealTestOpen(fresh, link.sealer.seal(sealTestFrames({"new 2"}))), "out_of_order");
  link.sealer.restart();
  EXPECT_EQ(sealTestOpen(fresh, link.sealer.seal(sealTestFrames({"newer 0"})), {"newer 0"}),
            "opened");
}

// The BadInput a malformed key gives, for the sealer and the opener alike.
std::string sealTestKeyError(const CurveKeyPair& own, const std::string& peer) {
  std::string sealer_error, opener_error;
  try {
    LinkSealer sealer(own, peer);
  } catch (const BadInput& e) {
    sealer_error = e.what();
  }
  try {
    LinkOpener opener(own, peer);
  } catch (const BadInput& e) {
    opener_error = e.what();
  }
  EXPECT_EQ(sealer_error, opener_error);
  return sealer_error;
}

TEST(RelaySeal, MalformedKeysAreBadInputNamingTheKey) {
  const CurveKeyPair a = generateCurveKeyPair(), b = generateCurveKeyPair();
  EXPECT_NE(sealTestKeyError(a, "short").find("the peer's public key is not a CURVE key"),
            std::string::npos);
  EXPECT_NE(sealTestKeyError(a, std::string(39, '0') + "~").find("the peer's public key"),
            std::string::npos);
  EXPECT_NE(sealTestKeyError({"", a.secret_key}, b.public_key).find("this node's public key"),
            std::string::npos);
  EXPECT_NE(sealTestKeyError({a.public_key, b.secret_key}, b.public_key).find("does not belong"),
            std::string::npos);
  EXPECT_NE(sealTestKeyError(a, a.public_key).find("is this node's own"), std::string::npos);
  // Z85 of 32 zero bytes: a point libsodium's crypto_box refuses.
  EXPECT_NE(sealTestKeyError(a, std::string(40, '0')).find("not a usable"), std::string::npos);
  EXPECT_EQ(sealTestKeyError(a, b.public_key), "");
}

TEST(RelaySeal, OpenedNamesAreMetricLabels) {
  EXPECT_STREQ(openedName(LinkOpener::Opened::kOpened), "opened");
  EXPECT_STREQ(openedName(LinkOpener::Opened::kForged), "forged");
  EXPECT_STREQ(openedName(LinkOpener::Opened::kReplayed), "replayed");
  EXPECT_STREQ(openedName(LinkOpener::Opened::kOutOfOrder), "out_of_order");
  EXPECT_STREQ(openedName(LinkOpener::Opened::kMalformed), "malformed");
}

}  // namespace
}  // namespace cairn
