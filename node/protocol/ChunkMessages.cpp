#include "node/protocol/ChunkMessages.h"

#include <nlohmann/json.hpp>

namespace cairn {
namespace {

constexpr size_t kMaxHeaderBytes = 4096;  // these headers are small

using nlohmann::json;

Frames withProtocol(json header, std::string attachment = {}, bool attach = false) {
  header["protocol"] = kCoordinationProtocol;
  Frames out{header.dump()};
  if (attach) out.push_back(std::move(attachment));
  return out;
}

// The header of `frames` when it is a `type` message with `attachments` attachments.
std::optional<json> headerOf(const Frames& f, const char* type, size_t attachments, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<json> {
    if (why) *why = reason;
    return std::nullopt;
  };
  if (f.empty()) return fail("empty message");
  if (f[0].size() > kMaxHeaderBytes)
    return fail(std::string(type) + ": header of " + std::to_string(f[0].size()) +
                " bytes exceeds " + std::to_string(kMaxHeaderBytes));
  json j = json::parse(f[0], nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return fail("header is not a JSON object");
  auto p = j.find("protocol");
  if (p == j.end() || !p->is_number_integer() || p->get<int64_t>() != kCoordinationProtocol)
    return fail("\"protocol\" must be " + std::to_string(kCoordinationProtocol) +
                " (a different cairn version?)");
  auto t = j.find("type");
  if (t == j.end() || !t->is_string() || *t != type)
    return fail(std::string("expected a ") + type + " message");
  if (f.size() - 1 != attachments)
    return fail(std::string(type) + ": " + std::to_string(f.size() - 1) + " attachments, expected " +
                std::to_string(attachments));
  return j;
}

// Unsigned integer field (≤ 2^63 − 1) or the reason it is not one.
bool unsignedField(const json& j, const char* type, const char* key, uint64_t* out, std::string* why) {
  auto it = j.find(key);
  if (it != j.end() && it->is_number_unsigned() && it->get<uint64_t>() <= uint64_t(INT64_MAX)) {
    *out = it->get<uint64_t>();
    return true;
  }
  if (it != j.end() && it->is_number_integer() && !it->is_number_unsigned() && it->get<int64_t>() >= 0) {
    *out = uint64_t(it->get<int64_t>());
    return true;
  }
  if (why) *why = std::string(type) + ": \"" + key + "\" must be a non-negative integer";
  return false;
}

bool chunkField(const json& j, const char* type, int64_t* out, std::string* why) {
  uint64_t v = 0;
  if (!unsignedField(j, type, "chunk", &v, why)) return false;
  *out = int64_t(v);
  return true;
}

bool stringField(const json& j, const char* type, const char* key, size_t max, std::string* out,
                 std::string* why) {
  auto it = j.find(key);
  if (it != j.end() && it->is_string() && !it->get<std::string>().empty() &&
      it->get<std::string>().size() <= max) {
    *out = it->get<std::string>();
    return true;
  }
  if (why)
    *why = std::string(type) + ": \"" + key + "\" must be a string of 1 to " + std::to_string(max) +
           " bytes";
  return false;
}

}  // namespace

Frames encode(const ChunkRequest& m) {
  return withProtocol({{"type", "chunk_request"}, {"name", m.name}, {"chunk", m.chunk},
                       {"offset", m.offset}, {"length", m.length}});
}
Frames encode(const ChunkPiece& m) {
  return withProtocol({{"type", "chunk_piece"}, {"chunk", m.chunk}, {"offset", m.offset},
                       {"total", m.total}},
                      m.bytes, /*attach=*/true);
}
Frames encode(const ChunkRefused& m) {
  return withProtocol({{"type", "chunk_refused"}, {"chunk", m.chunk}, {"reason", m.reason}});
}

bool isChunkRequest(const Frames& frames) {
  if (frames.empty() || frames[0].size() > kMaxHeaderBytes) return false;
  const json j = json::parse(frames[0], nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto t = j.find("type");
  return t != j.end() && t->is_string() && *t == "chunk_request";
}

std::optional<ChunkRequest> decodeChunkRequest(const Frames& frames, std::string* why) {
  const char* type = "chunk_request";
  const auto j = headerOf(frames, type, 0, why);
  if (!j) return std::nullopt;
  ChunkRequest m;
  if (!stringField(*j, type, "name", kMaxNodeNameBytes, &m.name, why) ||
      !chunkField(*j, type, &m.chunk, why) || !unsignedField(*j, type, "offset", &m.offset, why) ||
      !unsignedField(*j, type, "length", &m.length, why))
    return std::nullopt;
  if (m.length == 0 || m.length > kMaxChunkPieceBytes) {
    if (why)
      *why = std::string(type) + ": \"length\" must be 1 to " + std::to_string(kMaxChunkPieceBytes) +
             " bytes (got " + std::to_string(m.length) + ")";
    return std::nullopt;
  }
  return m;
}

std::optional<ChunkReply> decodeChunkReply(const Frames& frames, std::string* why) {
  if (frames.empty()) {
    if (why) *why = "empty message";
    return std::nullopt;
  }
  const json peek = json::parse(frames[0], nullptr, /*allow_exceptions=*/false);
  const bool refused = peek.is_object() && peek.contains("type") && peek["type"] == "chunk_refused";
  if (refused) {
    const auto j = headerOf(frames, "chunk_refused", 0, why);
    ChunkRefused m;
    if (!j || !chunkField(*j, "chunk_refused", &m.chunk, why) ||
        !stringField(*j, "chunk_refused", "reason", kMaxReasonBytes, &m.reason, why))
      return std::nullopt;
    return ChunkReply(std::move(m));
  }
  const char* type = "chunk_piece";
  const auto j = headerOf(frames, type, 1, why);
  ChunkPiece m;
  if (!j || !chunkField(*j, type, &m.chunk, why) || !unsignedField(*j, type, "offset", &m.offset, why) ||
      !unsignedField(*j, type, "total", &m.total, why))
    return std::nullopt;
  const uint64_t size = frames[1].size();
  if (size == 0 || size > kMaxChunkPieceBytes || m.offset > m.total || size > m.total - m.offset) {
    if (why)
      *why = std::string(type) + ": " + std::to_string(size) + " bytes at offset " +
             std::to_string(m.offset) + " do not fit a chunk of " + std::to_string(m.total) +
             " bytes (a piece holds 1 to " + std::to_string(kMaxChunkPieceBytes) + " bytes)";
    return std::nullopt;
  }
  m.bytes = frames[1];
  return ChunkReply(std::move(m));
}

}  // namespace cairn
