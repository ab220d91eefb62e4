#include "core/JobFiles.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/Error.h"

namespace cairn {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

std::string encodeBase64(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k)
      v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k)
      out.push_back(k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=');
  }
  return out;
}

std::optional<std::string> decodeBase64(const std::string& text) {
  std::array<int, 256> value;
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<unsigned char>(kAlphabet[i])] = i;
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    size_t padding = 0;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && last && k >= 2) {
        ++padding;
        v <<= 6;
        continue;
      }
      const int d = value[static_cast<unsigned char>(c)];
      if (d < 0 || padding > 0) return std::nullopt;  // bad character, or data after '='
      v = (v << 6) | uint32_t(d);
    }
    for (size_t k = 0; k < 3 - padding; ++k) out.push_back(char((v >> (16 - 8 * k)) & 0xff));
  }
  return out;
}

bool embedJobFiles(nlohmann::json* training_definition, const std::string& job_path) {
  if (!training_definition->is_object() || !training_definition->contains("loss_fn")) return false;
  nlohmann::json& loss = (*training_definition)["loss_fn"];
  if (!loss.is_object() || !loss.contains("torchscript") || loss.contains("torchscript_base64"))
    return false;
  const std::string key = "training_definition.loss_fn.torchscript";
  if (!loss["torchscript"].is_string() || loss["torchscript"].get<std::string>().empty())
    CAIRN_THROW(BadInput, job_path, ": ", key, " must name a TorchScript file");
  const std::filesystem::path file(loss["torchscript"].get<std::string>());
  const std::filesystem::path path =
      file.is_absolute() ? file : std::filesystem::path(job_path).parent_path() / file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    CAIRN_THROW(BadInput, job_path, ": ", key, " (", path.string(),
                "): no such file (a relative path is read from job.json's folder)");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxEmbeddedFileBytes)
    CAIRN_THROW(BadInput, job_path, ": ", key, " (", path.string(), "): ",
                ec ? ec.message() : std::to_string(size) + " bytes, more than the " +
                                        std::to_string(kMaxEmbeddedFileBytes) +
                                        " that can travel inside job.json");
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof())
    CAIRN_THROW(BadInput, job_path, ": ", key, " (", path.string(), "): cannot read the file");
  loss["torchscript_base64"] = encodeBase64(bytes);
  return true;
}

}  // namespace cairn
