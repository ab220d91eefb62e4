#include "node/transport/WireCodec.h"

#include <cstring>
#include <limits>
#include <memory>

#include <msgpack.hpp>

#include "core/Error.h"

namespace cairn {
namespace {

struct DtypeEntry {
  uint8_t code;
  torch::ScalarType type;
  const char* name;
};
// Codes are the protocol's, never reorder.
constexpr DtypeEntry kDtypes[] = {
    {0, torch::kFloat32, "float32"}, {1, torch::kFloat16, "float16"},
    {2, torch::kBFloat16, "bfloat16"}, {3, torch::kFloat64, "float64"},
    {4, torch::kInt64, "int64"},     {5, torch::kInt32, "int32"},
    {6, torch::kUInt8, "uint8"},     {7, torch::kBool, "bool"},
};

DecodeResult failure(DecodeError error) {
  DecodeResult r;
  r.error = std::move(error);
  return r;
}

DecodeResult failure(DecodeErrorCode code, std::string detail) {
  return failure(DecodeError{code, std::move(detail)});
}

// Header keys (short: the header travels with every micro-batch).
constexpr const char* kKeyVersion = "v";
constexpr const char* kKeyKind = "k";
constexpr const char* kKeyJob = "j";
constexpr const char* kKeySender = "s";
constexpr const char* kKeyStep = "st";
constexpr const char* kKeyMicrobatch = "mb";
constexpr const char* kKeyTag = "tag";
constexpr const char* kKeyText = "txt";
constexpr const char* kKeyTensors = "t";

constexpr size_t kMaxTagBytes = 256;
constexpr size_t kMaxTextBytes = 64 * 1024;
constexpr size_t kMaxNameBytes = 256;

bool keyIs(const msgpack::object& key, const char* name) {
  return key.type == msgpack::type::STR && key.via.str.size == std::strlen(name) &&
         std::memcmp(key.via.str.ptr, name, key.via.str.size) == 0;
}

bool readUnsigned(const msgpack::object& o, uint64_t* out) {
  if (o.type != msgpack::type::POSITIVE_INTEGER) return false;
  *out = o.via.u64;
  return true;
}

bool readString(const msgpack::object& o, size_t max_bytes, std::string* out) {
  if (o.type != msgpack::type::STR || o.via.str.size > max_bytes) return false;
  out->assign(o.via.str.ptr, o.via.str.size);
  return true;
}

// The tensor's storage outlives the zmq frame: ZeroMQ calls this when it has sent the bytes.
void releaseTensor(void* /*data*/, void* hint) { delete static_cast<torch::Tensor*>(hint); }

// Decoding (decodeMessage): each step returns the DecodeError that ends it, or nothing. The steps
// run in the order of the checks the protocol promises (docs/PROTOCOL.md), first failure wins.
using Failure = std::optional<DecodeError>;

Failure fail(DecodeErrorCode code, std::string detail) {
  return DecodeError{code, std::move(detail)};
}

// A tensor's descriptor, validated against its frame, before any tensor is created.
struct Described {
  std::string name;
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

// The header map's fields into `message` (all but its tensors), and its tensor list.
Failure readHeader(const msgpack::object& root, Message* message,
                   const msgpack::object** tensors) {
  bool have_version = false, have_kind = false, have_tensors = false;
  uint64_t version = 0, kind = 0;
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    const msgpack::object& key = root.via.map.ptr[i].key;
    const msgpack::object& val = root.via.map.ptr[i].val;
    bool ok = true;
    if (keyIs(key, kKeyVersion)) {
      ok = readUnsigned(val, &version), have_version = ok;
    } else if (keyIs(key, kKeyKind)) {
      ok = readUnsigned(val, &kind), have_kind = ok;
    } else if (keyIs(key, kKeyJob)) {
      ok = readString(val, kMaxNameBytes, &message->job_id);
    } else if (keyIs(key, kKeySender)) {
      ok = readString(val, kMaxNameBytes, &message->sender);
    } else if (keyIs(key, kKeyStep)) {
      ok = readUnsigned(val, &message->step);
    } else if (keyIs(key, kKeyMicrobatch)) {
      ok = readUnsigned(val, &message->microbatch);
    } else if (keyIs(key, kKeyTag)) {
      ok = readString(val, kMaxTagBytes, &message->tag);
    } else if (keyIs(key, kKeyText)) {
      ok = readString(val, kMaxTextBytes, &message->text);
    } else if (keyIs(key, kKeyTensors)) {
      ok = val.type == msgpack::type::ARRAY, *tensors = &val, have_tensors = ok;
    }  // unknown keys are ignored: newer minor additions stay readable
    if (!ok) return fail(DecodeErrorCode::kMalformedHeader, "field has the wrong type");
  }
  if (!have_version) return fail(DecodeErrorCode::kMalformedHeader, "no version");
  if (version != kWireVersion)
    return fail(DecodeErrorCode::kWrongVersion, "version " + std::to_string(version) +
                                                    ", expected " + std::to_string(kWireVersion));
  if (!have_kind) return fail(DecodeErrorCode::kMalformedHeader, "no kind");
  if (kind < 1 || kind > kMaxMessageKind)
    return fail(DecodeErrorCode::kUnknownKind, "kind " + std::to_string(kind));
  message->kind = static_cast<MessageKind>(kind);
  if (!have_tensors) return fail(DecodeErrorCode::kMalformedHeader, "no tensor list");
  return std::nullopt;
}

// The shape of a descriptor (`dims`, an array) into `out->shape`, and the bytes it describes.
// elements × itemsize with overflow checks: a header may claim 2^62 elements. The product of the
// non-zero dimensions must fit an int64 even when another dimension is 0: libtorch checks the
// whole product when it allocates ([2^55, 2^55, 0] makes torch::empty throw), so a shape it would
// refuse is refused here, as a malformed message, not an exception.
Failure readShape(const msgpack::object& dims, const std::string& which,
                  const CodecLimits& limits, Described* out, uint64_t* bytes) {
  const uint64_t itemsize = c10::elementSize(out->type);
  constexpr uint64_t kMaxBytes = uint64_t(std::numeric_limits<int64_t>::max());
  uint64_t nonzero_bytes = itemsize;
  bool any_zero = false;
  bool overflow = false;
  for (uint32_t k = 0; k < dims.via.array.size; ++k) {
    uint64_t dim = 0;
    if (!readUnsigned(dims.via.array.ptr[k], &dim) || dim > kMaxBytes)
      return fail(DecodeErrorCode::kMalformedHeader, which + ": bad dimension");
    out->shape.push_back(static_cast<int64_t>(dim));
    if (dim == 0) {
      any_zero = true;
      continue;
    }
    if (nonzero_bytes > kMaxBytes / dim) overflow = true;
    else nonzero_bytes *= dim;
  }
  *bytes = any_zero ? 0 : nonzero_bytes;
  if (overflow || *bytes > limits.max_message_bytes)
    return fail(DecodeErrorCode::kTooLarge, which + ": shape describes more than " +
                                                std::to_string(limits.max_message_bytes) +
                                                " bytes");
  return std::nullopt;
}

// Descriptor `d` of tensor `which` into `out`, checked against itself and its `frame`.
Failure describe(const msgpack::object& d, const std::string& which, const zmq::message_t& frame,
                 const CodecLimits& limits, Described* out) {
  if (d.type != msgpack::type::ARRAY || d.via.array.size != 4)
    return fail(DecodeErrorCode::kMalformedHeader,
                which + ": descriptor is not [name, dtype, shape, bytes]");
  const msgpack::object* f = d.via.array.ptr;
  uint64_t code = 0;
  if (!readString(f[0], kMaxNameBytes, &out->name) || !readUnsigned(f[1], &code) ||
      f[2].type != msgpack::type::ARRAY || !readUnsigned(f[3], &out->nbytes))
    return fail(DecodeErrorCode::kMalformedHeader,
                which + ": descriptor field has the wrong type");
  const auto type =
      code <= 255 ? scalarTypeForWireCode(static_cast<uint8_t>(code)) : std::nullopt;
  if (!type)
    return fail(DecodeErrorCode::kUnknownDtype, which + ": dtype code " + std::to_string(code));
  out->type = *type;
  if (f[2].via.array.size > limits.max_dims)
    return fail(DecodeErrorCode::kTooManyDimensions,
                which + ": " + std::to_string(f[2].via.array.size) + " dimensions");
  uint64_t bytes = 0;
  if (Failure bad = readShape(f[2], which, limits, out, &bytes)) return bad;
  if (bytes != out->nbytes)
    return fail(DecodeErrorCode::kShapeMismatch,
                which + ": shape × itemsize = " + std::to_string(bytes) +
                    " but the descriptor says " + std::to_string(out->nbytes));
  if (frame.size() != out->nbytes)
    return fail(DecodeErrorCode::kShapeMismatch,
                which + ": frame has " + std::to_string(frame.size()) +
                    " bytes, descriptor says " + std::to_string(out->nbytes));
  return std::nullopt;
}

// First pass: every descriptor of the `count` in `tensors` validated against its frame (and the
// message's total), before any tensor is created.
Failure describeAll(const msgpack::object& tensors, uint32_t count,
                    const std::vector<zmq::message_t>& frames, const CodecLimits& limits,
                    std::vector<Described>* described) {
  described->resize(count);
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string which = "tensor " + std::to_string(i);
    Described& out = (*described)[i];
    if (Failure bad = describe(tensors.via.array.ptr[i], which, frames[i + 1], limits, &out))
      return bad;
    total += out.nbytes;
    if (total > limits.max_message_bytes)
      return fail(DecodeErrorCode::kTooLarge, "tensors add up to more than " +
                                                  std::to_string(limits.max_message_bytes) +
                                                  " bytes");
    if (out.type == torch::kBool) {
      const auto* p = static_cast<const uint8_t*>(frames[i + 1].data());
      for (uint64_t b = 0; b < out.nbytes; ++b)
        if (p[b] > 1)
          return fail(DecodeErrorCode::kBadValue, which + ": bool byte is neither 0 nor 1");
    }
  }
  return std::nullopt;
}

// Second pass, one tensor: large, aligned frames become tensors without a copy (the frame is moved
// to the heap and freed by the tensor's deleter); others are copied.
Failure materialise(Described& d, zmq::message_t& frame, uint32_t i, const CodecLimits& limits,
                    torch::Tensor* t) {
  const auto options = torch::TensorOptions().dtype(d.type);
  const size_t itemsize = c10::elementSize(d.type);
  const bool aligned = reinterpret_cast<uintptr_t>(frame.data()) % itemsize == 0;
  // The first pass leaves libtorch nothing to refuse; should it still throw, the message is
  // dropped as malformed rather than the exception reaching the receiving node's loop.
  try {
    if (d.nbytes >= limits.zero_copy_threshold && aligned) {
      auto owned = std::make_unique<zmq::message_t>(std::move(frame));
      zmq::message_t* raw = owned.get();
      *t = torch::from_blob(raw->data(), d.shape, [raw](void*) { delete raw; }, options);
      owned.release();  // the tensor's deleter owns it now
    } else {
      *t = torch::empty(d.shape, options);
      if (d.nbytes) std::memcpy(t->data_ptr(), frame.data(), d.nbytes);
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return fail(DecodeErrorCode::kBadValue, "tensor " + std::to_string(i) +
                                                ": libtorch refused the shape: " +
                                                what.substr(0, what.find('\n')));
  }
  return std::nullopt;
}

}  // namespace

const char* toString(MessageKind kind) {
  switch (kind) {
    case MessageKind::kActivation:
      return "activation";
    case MessageKind::kGradient:
      return "gradient";
    case MessageKind::kControl:
      return "control";
    case MessageKind::kHeartbeat:
      return "heartbeat";
    case MessageKind::kCollective:
      return "collective";
    case MessageKind::kEvaluation:
      return "evaluation";
  }
  return "unknown";
}

const char* toString(DecodeErrorCode code) {
  switch (code) {
    case DecodeErrorCode::kNoFrames:
      return "no frames";
    case DecodeErrorCode::kHeaderTooLarge:
      return "header too large";
    case DecodeErrorCode::kMalformedHeader:
      return "malformed header";
    case DecodeErrorCode::kWrongVersion:
      return "wrong protocol version";
    case DecodeErrorCode::kUnknownKind:
      return "unknown message kind";
    case DecodeErrorCode::kUnknownDtype:
      return "unknown dtype";
    case DecodeErrorCode::kTooManyTensors:
      return "too many tensors";
    case DecodeErrorCode::kTooManyDimensions:
      return "too many dimensions";
    case DecodeErrorCode::kFrameCountMismatch:
      return "frame count mismatch";
    case DecodeErrorCode::kShapeMismatch:
      return "shape/length mismatch";
    case DecodeErrorCode::kTooLarge:
      return "message too large";
    case DecodeErrorCode::kBadValue:
      return "bad tensor value";
  }
  return "unknown";
}

std::optional<uint8_t> wireDtypeCode(torch::ScalarType type) {
  for (const auto& e : kDtypes)
    if (e.type == type) return e.code;
  return std::nullopt;
}

std::optional<torch::ScalarType> scalarTypeForWireCode(uint8_t code) {
  for (const auto& e : kDtypes)
    if (e.code == code) return e.type;
  return std::nullopt;
}

std::optional<torch::ScalarType> scalarTypeForName(const std::string& name) {
  for (const auto& e : kDtypes)
    if (name == e.name) return e.type;
  return std::nullopt;
}

std::string dtypeName(torch::ScalarType type) {
  for (const auto& e : kDtypes)
    if (e.type == type) return e.name;
  return c10::toString(type);
}

std::vector<zmq::message_t> encodeMessage(const Message& message, const CodecLimits& limits) {
  CAIRN_ENFORCE(message.tensors.size() <= limits.max_tensors, "too many tensors to send");
  CAIRN_ENFORCE(message.tag.size() <= kMaxTagBytes, "tag longer than ", kMaxTagBytes, " bytes");
  CAIRN_ENFORCE(message.text.size() <= kMaxTextBytes, "text longer than ", kMaxTextBytes, " bytes");
  std::vector<torch::Tensor> contiguous;
  contiguous.reserve(message.tensors.size());
  for (const auto& named : message.tensors) {
    const auto& t = named.tensor;
    CAIRN_ENFORCE(t.defined(), "tensor \"", named.name, "\" is undefined");
    CAIRN_ENFORCE(t.device().is_cpu(), "tensor \"", named.name, "\" is not on the CPU");
    CAIRN_ENFORCE(wireDtypeCode(t.scalar_type()).has_value(), "tensor \"", named.name,
                  "\" has dtype ", c10::toString(t.scalar_type()), " which the wire does not carry");
    CAIRN_ENFORCE(static_cast<size_t>(t.dim()) <= limits.max_dims, "tensor \"", named.name,
                  "\" has too many dimensions");
    contiguous.push_back(t.is_contiguous() ? t : t.contiguous());
  }

  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pk.pack_map(9);
  pk.pack(kKeyVersion), pk.pack(kWireVersion);
  pk.pack(kKeyKind), pk.pack(static_cast<uint8_t>(message.kind));
  pk.pack(kKeyJob), pk.pack(message.job_id);
  pk.pack(kKeySender), pk.pack(message.sender);
  pk.pack(kKeyStep), pk.pack(message.step);
  pk.pack(kKeyMicrobatch), pk.pack(message.microbatch);
  pk.pack(kKeyTag), pk.pack(message.tag);
  pk.pack(kKeyText), pk.pack(message.text);
  pk.pack(kKeyTensors);
  pk.pack_array(static_cast<uint32_t>(contiguous.size()));
  for (size_t i = 0; i < contiguous.size(); ++i) {
    const auto& t = contiguous[i];
    pk.pack_array(4);
    pk.pack(message.tensors[i].name);
    pk.pack(*wireDtypeCode(t.scalar_type()));
    pk.pack_array(static_cast<uint32_t>(t.dim()));
    for (int64_t d : t.sizes()) pk.pack(static_cast<uint64_t>(d));
    pk.pack(static_cast<uint64_t>(t.nbytes()));
  }

  std::vector<zmq::message_t> frames;
  frames.reserve(1 + contiguous.size());
  frames.emplace_back(buffer.data(), buffer.size());
  for (auto& t : contiguous) {
    const size_t n = t.nbytes();
    if (n >= limits.zero_copy_threshold) {
      auto* keep_alive = new torch::Tensor(t);
      frames.emplace_back(t.data_ptr(), n, &releaseTensor, keep_alive);
    } else {
      frames.emplace_back(n == 0 ? nullptr : t.data_ptr(), n);
    }
  }
  return frames;
}

DecodeResult decodeMessage(std::vector<zmq::message_t>&& frames, const CodecLimits& limits) {
  if (frames.empty()) return failure(DecodeErrorCode::kNoFrames, "empty multipart message");
  const zmq::message_t& head = frames[0];
  if (head.size() > limits.max_header_bytes)
    return failure(DecodeErrorCode::kHeaderTooLarge,
                   "header of " + std::to_string(head.size()) + " bytes");

  // Limits bound what msgpack may allocate while parsing: arrays/maps/strings/depth.
  const msgpack::unpack_limit unpack_limits(/*array=*/std::max<size_t>(limits.max_tensors, 64),
                                            /*map=*/32, /*str=*/kMaxTextBytes, /*bin=*/0,
                                            /*ext=*/0, /*depth=*/4);
  msgpack::object_handle handle;
  try {
    std::size_t offset = 0;
    handle = msgpack::unpack(static_cast<const char*>(head.data()), head.size(), offset, nullptr,
                             nullptr, unpack_limits);
    if (offset != head.size())
      return failure(DecodeErrorCode::kMalformedHeader, "trailing bytes after the header");
  } catch (const std::exception& e) {
    return failure(DecodeErrorCode::kMalformedHeader, e.what());
  }
  const msgpack::object& root = handle.get();
  if (root.type != msgpack::type::MAP)
    return failure(DecodeErrorCode::kMalformedHeader, "header is not a map");

  Message message;
  const msgpack::object* tensors = nullptr;
  if (Failure bad = readHeader(root, &message, &tensors)) return failure(std::move(*bad));
  const uint32_t count = tensors->via.array.size;
  if (count > limits.max_tensors)
    return failure(DecodeErrorCode::kTooManyTensors, std::to_string(count) + " tensors");
  if (frames.size() != size_t{count} + 1)
    return failure(DecodeErrorCode::kFrameCountMismatch,
                   std::to_string(count) + " tensors described, " +
                       std::to_string(frames.size() - 1) + " frames received");
  std::vector<Described> described;
  if (Failure bad = describeAll(*tensors, count, frames, limits, &described))
    return failure(std::move(*bad));
  // Second pass: materialise.
  message.tensors.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    torch::Tensor t;
    if (Failure bad = materialise(described[i], frames[i + 1], i, limits, &t))
      return failure(std::move(*bad));
    message.tensors.push_back({std::move(described[i].name), std::move(t)});
  }
  DecodeResult result;
  result.message = std::move(message);
  return result;
}

}  // namespace cairn
