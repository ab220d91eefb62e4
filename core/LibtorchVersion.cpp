#include "core/LibtorchVersion.h"

#include <cctype>

namespace cairn {

std::optional<LibtorchVersion> parseLibtorchVersion(const std::string& text) {
  if (text.empty() || text.size() > kMaxLibtorchVersionBytes) return std::nullopt;
  long parts[3] = {0, 0, 0};
  size_t at = 0;
  for (int part = 0; part < 3; ++part) {
    if (part > 0) {
      if (at >= text.size() || text[at] != '.') return std::nullopt;
      ++at;
    }
    const size_t start = at;
    while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) {
      if (at - start >= 6) return std::nullopt;
      parts[part] = parts[part] * 10 + (text[at] - '0');
      ++at;
    }
    if (at == start) return std::nullopt;
  }
  if (at != text.size()) return std::nullopt;
  return LibtorchVersion{parts[0], parts[1], parts[2]};
}

bool canLoadStageFiles(const LibtorchVersion& reader, const LibtorchVersion& writer) {
  return reader.major > writer.major ||
         (reader.major == writer.major && reader.minor >= writer.minor);
}

std::string stageFilesProblem(const std::string& who, const std::string& reader,
                              const std::string& writer) {
  const auto r = parseLibtorchVersion(reader), w = parseLibtorchVersion(writer);
  if (!r || !w || canLoadStageFiles(*r, *w)) return {};
  return who + "'s libtorch " + reader + " cannot load stage files written by libtorch " + writer +
         "; install cairn built against libtorch ≥ " + std::to_string(w->major) + "." +
         std::to_string(w->minor);
}

}  // namespace cairn
