#include "core/Safetensors.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/Error.h"

namespace cairn {
namespace {

// The reference implementation refuses larger headers too; it keeps a hostile length from making
// us allocate gigabytes before anything is validated.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

struct Entry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // within the data section
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
  uint64_t data_begin = 0;  // file offset of the data section
};

uint64_t fileSize(std::ifstream& in) {
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  return size;
}

Entry parseEntry(const std::string& path, const std::string& name, const nlohmann::json& value,
                 uint64_t data_size) {
  const std::string where = path + ": tensor " + inQuotes(name);
  if (!value.is_object()) CAIRN_THROW(BadInput, where, ": header entry is not an object");
  for (const auto& item : value.items())
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets")
      CAIRN_THROW(BadInput, where, ": unknown header key ", inQuotes(item.key()));
  if (!value.contains("dtype") || !value["dtype"].is_string())
    CAIRN_THROW(BadInput, where, ": dtype must be a string");
  Entry entry;
  entry.name = name;
  entry.dtype = safetensorsDtype(value["dtype"].get<std::string>(), where);
  const uint64_t item_size = c10::elementSize(entry.dtype);

  if (!value.contains("shape") || !value["shape"].is_array())
    CAIRN_THROW(BadInput, where, ": shape must be a list of non-negative integers");
  // Saturating product: a hostile shape must not overflow into a small byte count.
  uint64_t elements = 1;
  bool zero = false, saturated = false;
  for (const auto& d : value["shape"]) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      CAIRN_THROW(BadInput, where, ": shape must be a list of non-negative integers (got ",
                  value["shape"].dump(), ")");
    const uint64_t size = d.get<uint64_t>();
    entry.shape.push_back(static_cast<int64_t>(size));
    if (size == 0) {
      zero = true;
    } else if (!saturated) {
      if (elements > std::numeric_limits<uint64_t>::max() / size)
        saturated = true;
      else
        elements *= size;
    }
  }
  if (zero) elements = 0, saturated = false;
  const bool fits = !saturated && elements <= std::numeric_limits<uint64_t>::max() / item_size;

  const auto& offsets = value.contains("data_offsets") ? value["data_offsets"] : nlohmann::json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    CAIRN_THROW(BadInput, where, ": data_offsets must be [begin, end] (non-negative integers)");
  entry.begin = offsets[0].get<uint64_t>();
  entry.end = offsets[1].get<uint64_t>();
  if (entry.end < entry.begin || entry.end > data_size)
    CAIRN_THROW(BadInput, where, ": data_offsets [", entry.begin, ", ", entry.end,
                "] lie outside the data section of ", data_size, " bytes");
  if (!fits || entry.end - entry.begin != elements * item_size)
    CAIRN_THROW(BadInput, where, ": data_offsets [", entry.begin, ", ", entry.end, "] hold ",
                entry.end - entry.begin, " bytes but shape ", value["shape"].dump(), " of ",
                value["dtype"].get<std::string>(), " needs ",
                !fits ? "more than 2^64" : std::to_string(elements * item_size));
  return entry;
}

Header readHeader(std::ifstream& in, const std::string& path) {
  const uint64_t size = fileSize(in);
  if (size < 8)
    CAIRN_THROW(BadInput, path, ": too short for a safetensors file (", size, " bytes)");
  unsigned char length_bytes[8];
  in.read(reinterpret_cast<char*>(length_bytes), 8);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  if (header_size > size - 8 || header_size > kMaxHeaderBytes)
    CAIRN_THROW(BadInput, path, ": safetensors header length ", header_size, " exceeds ",
                header_size > size - 8 ? "the file (" + std::to_string(size) + " bytes)"
                                       : "the 100 MB limit");
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  if (!in) CAIRN_THROW(BadInput, path, ": cannot read the safetensors header");
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    CAIRN_THROW(BadInput, path, ": safetensors header is not JSON: ", e.what());
  }
  if (!document.is_object())
    CAIRN_THROW(BadInput, path, ": safetensors header is not a JSON object");

  Header header;
  header.data_begin = 8 + header_size;
  const uint64_t data_size = size - header.data_begin;
  for (const auto& item : document.items()) {
    if (item.key() == kMetadataKey) {
      if (!item.value().is_object())
        CAIRN_THROW(BadInput, path, ": __metadata__ must be an object of strings");
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string())
          CAIRN_THROW(BadInput, path, ": __metadata__ ", inQuotes(m.key()), " must be a string");
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    header.entries.push_back(parseEntry(path, item.key(), item.value(), data_size));
  }
  std::sort(header.entries.begin(), header.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The data section must be covered exactly: no overlaps, no holes, nothing after the end.
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : header.entries) {
    if (e.begin < covered)
      CAIRN_THROW(BadInput, path, ": tensors ", inQuotes(previous->name), " and ", inQuotes(e.name),
                  " overlap (bytes [", previous->begin, ", ", previous->end, ") and [", e.begin,
                  ", ", e.end, ") of the data section)");
    if (e.begin > covered)
      CAIRN_THROW(BadInput, path, ": bytes [", covered, ", ", e.begin,
                  ") of the data section belong to no tensor (before tensor ", inQuotes(e.name),
                  ")");
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size)
    CAIRN_THROW(BadInput, path, ": the data section has ", data_size,
                " bytes but its tensors cover ", covered);
  return header;
}

}  // namespace

torch::ScalarType safetensorsDtype(const std::string& name, const std::string& source) {
  static const std::map<std::string, torch::ScalarType> types = {
      {"F64", torch::kDouble},    {"F32", torch::kFloat}, {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16}, {"I64", torch::kLong},  {"I32", torch::kInt},
      {"I16", torch::kShort},     {"I8", torch::kChar},   {"U8", torch::kByte},
      {"BOOL", torch::kBool}};
  auto it = types.find(name);
  if (it == types.end())
    CAIRN_THROW(BadInput, source, ": unsupported safetensors dtype ", inQuotes(name),
                " (cairn reads F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)");
  return it->second;
}

std::string safetensorsDtypeName(torch::ScalarType type) {
  switch (type) {
    case torch::kDouble:
      return "F64";
    case torch::kFloat:
      return "F32";
    case torch::kHalf:
      return "F16";
    case torch::kBFloat16:
      return "BF16";
    case torch::kLong:
      return "I64";
    case torch::kInt:
      return "I32";
    case torch::kShort:
      return "I16";
    case torch::kChar:
      return "I8";
    case torch::kByte:
      return "U8";
    case torch::kBool:
      return "BOOL";
    default:
      CAIRN_THROW(BadInput, "safetensors has no dtype for torch ", c10::toString(type));
  }
}

NamedTensors readSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot open");
  const Header header = readHeader(in, path);
  NamedTensors out;
  for (const Entry& e : header.entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) {
      in.seekg(static_cast<std::streamoff>(header.data_begin + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
      if (!in) CAIRN_THROW(BadInput, path, ": tensor ", inQuotes(e.name), ": cannot read its data");
    }
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

std::vector<SafetensorsEntry> readSafetensorsIndex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot open");
  const Header header = readHeader(in, path);
  std::vector<SafetensorsEntry> out;
  for (const Entry& e : header.entries)
    out.push_back({e.name, e.dtype, e.shape, header.data_begin + e.begin, e.end - e.begin});
  return out;
}

std::map<std::string, std::string> readSafetensorsMetadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot open");
  return readHeader(in, path).metadata;
}

void writeSafetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::vector<torch::Tensor> contiguous;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey || !names.insert(name).second)
      CAIRN_THROW(BadInput, path, ": tensor name ", inQuotes(name),
                  name == kMetadataKey ? " is reserved" : " appears twice");
    torch::Tensor t = tensor.detach().cpu().contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", safetensorsDtypeName(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(t));
  }
  std::string text = header.dump();
  while (text.size() % 8) text.push_back(' ');  // aligns the data section, as the reference does
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) CAIRN_THROW(BadInput, temporary, ": cannot write");
    const uint64_t length = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : contiguous)
      out.write(static_cast<const char*>(t.data_ptr()),
                static_cast<std::streamsize>(t.numel() * t.element_size()));
    out.flush();
    if (!out) CAIRN_THROW(BadInput, temporary, ": write failed (disk full?)");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    CAIRN_THROW(BadInput, path, ": cannot rename ", temporary, " into place");
}

}  // namespace cairn
