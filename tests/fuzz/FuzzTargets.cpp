#include "tests/fuzz/FuzzTargets.h"

#include <cstdlib>
#include <cstring>

#include "core/Error.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"
#include "node/transport/WireCodec.h"

namespace cairn::fuzz {

void wireDecoder(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const size_t count = 1 + data[0] % 8;
  size_t offset = 1;
  std::vector<zmq::message_t> frames;
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
    frames.emplace_back(data + offset, length);
    offset += length;
  }
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
