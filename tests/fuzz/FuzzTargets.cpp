#include "tests/fuzz/FuzzTargets.h"

#include <cstdlib>
#include <cstring>
#include <optional>
#include <variant>

#include "core/Error.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"
#include "node/protocol/ChunkMessages.h"
#include "node/protocol/CollectiveNotices.h"
#include "node/protocol/Coordination.h"
#include "node/protocol/PipelineControl.h"
#include "node/protocol/RingJoin.h"
#include "node/transport/WireCodec.h"

namespace cairn::fuzz {

std::vector<std::string> unpackFrames(const uint8_t* data, size_t size) {
  std::vector<std::string> frames;
  if (size == 0) return frames;
  const size_t count = 1 + data[0] % 8;
  size_t offset = 1;
  for (size_t i = 0; i < count; ++i) {
    size_t length = size - offset;
    if (i + 1 < count && size - offset >= 4) {
      uint32_t declared = 0;
      std::memcpy(&declared, data + offset, 4);
      offset += 4;
      length = std::min<size_t>(declared, size - offset);
    } else if (i + 1 < count) {
      length = 0;
    }
    frames.emplace_back(reinterpret_cast<const char*>(data) + offset, length);
    offset += length;
  }
  return frames;
}

namespace {

// The wire decoder's limits in every target: the fuzzer's memory stays bounded.
CodecLimits fuzzLimits() {
  CodecLimits limits;
  limits.max_message_bytes = 1 << 20;
  return limits;
}

std::vector<zmq::message_t> zmqFrames(const std::vector<std::string>& parts) {
  std::vector<zmq::message_t> frames;
  for (const auto& part : parts) frames.emplace_back(part.data(), part.size());
  return frames;
}

// A pipeline-wire message as it arrives: through the wire decoder (nullopt when it refuses it).
std::optional<Message> wireMessage(const uint8_t* data, size_t size) {
  if (size == 0) return std::nullopt;
  DecodeResult r = decodeMessage(zmqFrames(unpackFrames(data, size)), fuzzLimits());
  if (r.ok() == r.error.has_value()) std::abort();
  if (!r.ok()) return std::nullopt;
  return std::move(*r.message);
}

// The bytes a Message travels as (to compare two messages exactly).
std::vector<std::string> wireBytes(const Message& m) {
  std::vector<std::string> parts;
  for (auto& f : encodeMessage(m, fuzzLimits())) parts.emplace_back(static_cast<const char*>(f.data()), f.size());
  return parts;
}

// A decoder's verdict: exactly one of a value and a reason.
template <typename T>
bool accepted(const std::optional<T>& value, const std::string& why) {
  if (value.has_value() == !why.empty()) std::abort();
  return value.has_value();
}

// A message-based decoder: `decode(m, &why)`; what it accepts, encoded by `encode` and decoded
// again, is accepted again and encodes to the same bytes.
template <typename Decode, typename Encode>
void fixedPoint(const Message& m, Decode decode, Encode encode) {
  std::string why;
  const auto value = decode(m, &why);
  if (!accepted(value, why)) return;
  const Message once = encode(*value);
  std::string again_why;
  const auto again = decode(once, &again_why);
  if (!accepted(again, again_why)) std::abort();  // what it wrote it must read
  if (wireBytes(encode(*again)) != wireBytes(once)) std::abort();
}

// The same for frame-based (coordination) decoders; `encode` takes the decoded value.
template <typename Decode, typename Encode>
void framesFixedPoint(const Frames& frames, Decode decode, Encode encode) {
  std::string why;
  const auto value = decode(frames, &why);
  if (!accepted(value, why)) return;
  const Frames once = encode(*value);
  std::string again_why;
  const auto again = decode(once, &again_why);
  if (!accepted(again, again_why)) std::abort();
  if (encode(*again) != once) std::abort();
}

// Encodes whichever message a variant holds.
const auto encodeAny = [](const auto& variant) {
  return std::visit([](const auto& m) { return encode(m); }, variant);
};

}  // namespace

void coordination(const uint8_t* data, size_t size) {
  const Frames frames = unpackFrames(data, size);
  constexpr size_t kAttachments = 1 << 20;
  framesFixedPoint(frames, [](const Frames& f, std::string* why) { return decodeToCoordinator(f, kAttachments, why); },
                   encodeAny);
  framesFixedPoint(frames, [](const Frames& f, std::string* why) { return decodeToVolunteer(f, kAttachments, why); },
                   encodeAny);
  framesFixedPoint(frames, [](const Frames& f, std::string* why) { return decodeReach(f, why); }, encodeAny);
}

void chunks(const uint8_t* data, size_t size) {
  const Frames frames = unpackFrames(data, size);
  (void)isChunkRequest(frames);  // the coordinator's routing look at every message
  framesFixedPoint(frames, [](const Frames& f, std::string* why) { return decodeChunkRequest(f, why); },
                   [](const ChunkRequest& m) { return encode(m); });
  framesFixedPoint(frames, [](const Frames& f, std::string* why) { return decodeChunkReply(f, why); }, encodeAny);
}

void pipelineControl(const uint8_t* data, size_t size) {
  const auto m = wireMessage(data, size);
  if (!m) return;
  const ControlOrigin from{m->job_id, m->sender};
  for (const char* tag : {kHelloTag, kLeavingTag, kCheckpointStepsTag, kResumeAtTag}) (void)isControl(*m, tag);
  auto encoder = [&from](const auto& value) { return encode(from, value); };
  fixedPoint(*m, decodeHello, encoder);
  fixedPoint(*m, decodeLeaving, encoder);
  fixedPoint(*m, decodeCheckpointSteps, encoder);
  fixedPoint(*m, decodeResumeAt, encoder);
}

void ringJoin(const uint8_t* data, size_t size) {
  const auto m = wireMessage(data, size);
  if (!m) return;
  (void)isWelcome(*m);
  (void)isClosed(*m);
  auto encoder = [](const auto& value) { return encode(value); };
  fixedPoint(*m, decodeJoinRequest, encoder);
  fixedPoint(*m, decodeWelcome, encoder);
  fixedPoint(*m, decodeClosed, encoder);
}

void collectiveNotices(const uint8_t* data, size_t size) {
  const auto m = wireMessage(data, size);
  if (!m) return;
  (void)collectiveMessageType(*m);
  auto encoder = [](const auto& value) { return encode(value); };
  fixedPoint(*m, decodeAbort, encoder);
  fixedPoint(*m, decodeKeepAlive, encoder);
  fixedPoint(*m, decodeLeave, encoder);
}

void wireDecoder(const uint8_t* data, size_t size) {
  if (size == 0) return;
  std::vector<zmq::message_t> frames = zmqFrames(unpackFrames(data, size));
  CodecLimits limits;
  limits.max_message_bytes = 1 << 20;  // keep the fuzzer's memory bounded
  DecodeResult r = decodeMessage(std::move(frames), limits);
  if (r.ok() == r.error.has_value()) std::abort();  // exactly one must be set
  if (r.ok()) {
    // A decoded message must be fully usable: touch every byte and re-encode it.
    for (const auto& t : r.message->tensors) {
      if (!t.tensor.is_contiguous()) std::abort();
      volatile uint8_t sink = 0;
      const auto* p = static_cast<const uint8_t*>(t.tensor.data_ptr());
      for (size_t b = 0; b < t.tensor.nbytes(); ++b) sink ^= p[b];
      (void)sink;
    }
    auto again = encodeMessage(*r.message, limits);
    if (again.size() != r.message->tensors.size() + 1) std::abort();
  }
}

std::vector<uint8_t> packFrames(const std::vector<std::string>& frames) {
  std::vector<uint8_t> out;
  out.push_back(static_cast<uint8_t>(frames.size() - 1));
  for (size_t i = 0; i < frames.size(); ++i) {
    if (i + 1 < frames.size()) {
      const uint32_t n = static_cast<uint32_t>(frames[i].size());
      const auto* b = reinterpret_cast<const uint8_t*>(&n);
      out.insert(out.end(), b, b + 4);
    }
    out.insert(out.end(), frames[i].begin(), frames[i].end());
  }
  return out;
}

void nodeData(const uint8_t* data, size_t size) {
  const auto document = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return;
  auto expectValidatedOrBadInput = [&](auto parse) {
    try {
      parse();
    } catch (const BadInput& e) {
      if (std::strlen(e.what()) == 0) std::abort();  // a rejection must say why
    }
    // Anything else (nlohmann type_error, std::out_of_range, …) escapes and is a finding.
  };
  expectValidatedOrBadInput([&] { parseNodeSpec(document, "node.json"); });
  expectValidatedOrBadInput([&] { parseJobSpec(document, "job.json"); });
  expectValidatedOrBadInput([&] { parseNodeConfigs(document, "node_configs.json"); });
  // Round trip: what parses must serialise and parse again to the same thing.
  try {
    const NodeSpec node = parseNodeSpec(document, "node.json");
    if (toJson(parseNodeSpec(toJson(node), "node.json")) != toJson(node)) std::abort();
  } catch (const BadInput&) {
  }
}

}  // namespace cairn::fuzz
