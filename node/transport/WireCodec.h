// The wire format (docs/PROTOCOL.md, byte for byte): a multipart ZeroMQ message of one msgpack
// header frame followed by one raw frame per tensor. Tensors at or above a size threshold are
// sent without a copy (the frame borrows the tensor's storage and keeps the tensor alive until
// ZeroMQ is done) and received without a copy (the tensor borrows the frame). decode() trusts
// nothing: every field is checked before it is used, and no allocation depends on a size the
// peer claimed without first matching it against bytes actually received.
// Thread-safety: free functions over values; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>
#include <zmq.hpp>

namespace cairn {

constexpr uint32_t kWireVersion = 1;

enum class MessageKind : uint8_t {
  kActivation = 1,  // boundary tensors, downstream
  kGradient = 2,    // gradients of a boundary, upstream
  kControl = 3,     // small JSON in `text` (hello, step done, eval results, ...)
  kHeartbeat = 4,
  kCollective = 5,  // a chunk of a collective operation (tag names the operation)
  kEvaluation = 6,  // forward-only boundary tensors during evaluation
};
constexpr uint8_t kMaxMessageKind = 6;
const char* toString(MessageKind kind);

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
};

struct Message {
  MessageKind kind = MessageKind::kControl;
  std::string job_id;
  std::string sender;
  uint64_t step = 0;
  uint64_t microbatch = 0;
  std::string tag;   // free-form routing key (e.g. collective id), ≤ 256 bytes
  std::string text;  // free-form payload (JSON for control messages), ≤ 64 KiB
  std::vector<NamedTensor> tensors;
};

// Wire dtype codes (stable: they are part of the protocol).
std::optional<uint8_t> wireDtypeCode(torch::ScalarType type);
std::optional<torch::ScalarType> scalarTypeForWireCode(uint8_t code);
std::optional<torch::ScalarType> scalarTypeForName(const std::string& name);  // "float32" …
std::string dtypeName(torch::ScalarType type);

struct CodecLimits {
  size_t zero_copy_threshold = 64 * 1024;     // bytes; smaller tensors are copied
  uint64_t max_message_bytes = 1ull << 31;    // all tensor bytes of one message
  size_t max_tensors = 1024;
  size_t max_dims = 16;
  size_t max_header_bytes = 1 << 20;
};

enum class DecodeErrorCode {
  kNoFrames,
  kHeaderTooLarge,
  kMalformedHeader,  // not msgpack, truncated, or wrong types
  kWrongVersion,
  kUnknownKind,
  kUnknownDtype,
  kTooManyTensors,
  kTooManyDimensions,
  kFrameCountMismatch,  // frames present != tensors described
  kShapeMismatch,       // shape × itemsize != byte length, or != frame size
  kTooLarge,            // over max_message_bytes (or an overflowing shape)
  kBadValue,            // e.g. a bool byte that is neither 0 nor 1
};
const char* toString(DecodeErrorCode code);

struct DecodeError {
  DecodeErrorCode code;
  std::string detail;
};

// Exactly one of message / error is set.
struct DecodeResult {
  std::optional<Message> message;
  std::optional<DecodeError> error;
  bool ok() const { return message.has_value(); }
};

// Tensors must be on the CPU with a wire dtype; non-contiguous ones are made contiguous.
// Throws InternalError for a dtype or device the protocol does not carry (a programming error).
std::vector<zmq::message_t> encodeMessage(const Message& message, const CodecLimits& limits = {});
DecodeResult decodeMessage(std::vector<zmq::message_t>&& frames, const CodecLimits& limits = {});

}  // namespace cairn
