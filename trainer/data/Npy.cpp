#include "trainer/data/Npy.h"

#include <cctype>
#include <cstring>
#include <limits>
#include <map>

#include "core/Error.h"

namespace cairn {
namespace {

// A recursive-descent reader for the one literal numpy writes: {str: value, ...} where a value is
// a str, True/False or a tuple of non-negative ints. Every failure names the file.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  std::map<std::string, std::string> dict() {
    std::map<std::string, std::string> out;  // key -> the value's source text
    expect('{');
    for (;;) {
      skipSpace();
      if (peek() == '}') break;
      const std::string key = quoted();
      expect(':');
      skipSpace();
      std::string value;
      if (peek() == '\'' || peek() == '"') {
        value = "'" + quoted() + "'";
      } else if (peek() == '(') {
        value = tuple();
      } else {
        value = word();
      }
      if (!out.emplace(key, value).second) fail("key '" + key + "' appears twice");
      skipSpace();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    skipSpace();
    if (i_ != s_.size()) fail("unexpected text after the dict");
    return out;
  }

  [[noreturn]] void fail(const std::string& what) const {
    CAIRN_THROW(BadInput, path_, ": .npy header ", what, " (at character ", i_, " of \"", s_,
                "\")");
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skipSpace() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t')) ++i_;
  }
  void expect(char c) {
    skipSpace();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string quoted() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted key");
    const size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail("has an unterminated string");
    std::string out = s_.substr(i_ + 1, end - i_ - 1);
    if (out.find('\\') != std::string::npos) fail("has an escaped string");
    i_ = end + 1;
    return out;
  }
  std::string word() {
    const size_t begin = i_;
    while (i_ < s_.size() && std::isalnum(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (begin == i_) fail("has a value that is not a string, a tuple, True or False");
    return s_.substr(begin, i_ - begin);
  }
  // "(3, 4)" -> "3,4"; "(5,)" -> "5"; "()" -> "".
  std::string tuple() {
    ++i_;
    std::string out;
    for (;;) {
      skipSpace();
      if (peek() == ')') break;
      const size_t begin = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      if (begin == i_) fail("shape holds something that is not a non-negative integer");
      if (!out.empty()) out += ",";
      out += s_.substr(begin, i_ - begin);
      skipSpace();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != ')') fail("shape: expected ',' or ')'");
    }
    ++i_;
    return "(" + out + ")";
  }

  const std::string& s_;
  const std::string& path_;
  size_t i_ = 0;
};

uint32_t littleEndian(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

NpyArray readNpyHeader(const FileReader& file) {
  const std::string& path = file.path();
  static const char kMagic[] = "\x93NUMPY";
  if (file.size() < 10) CAIRN_THROW(BadInput, path, ": not a .npy file (", file.size(), " bytes)");
  const std::vector<uint8_t> preamble = file.read(0, 10, "the .npy preamble");
  if (std::memcmp(preamble.data(), kMagic, 6) != 0)
    CAIRN_THROW(BadInput, path, ": not a .npy file (no \\x93NUMPY magic)");
  const int major = preamble[6];
  if (major < 1 || major > 3)
    CAIRN_THROW(BadInput, path, ": .npy format version ", major, ".", int(preamble[7]),
                " is not 1, 2 or 3");
  const int length_bytes = major == 1 ? 2 : 4;
  const uint64_t prefix = 6 + 2 + uint64_t(length_bytes);
  const std::vector<uint8_t> length =
      file.read(8, uint64_t(length_bytes), "the .npy header length");
  const uint32_t header_length = littleEndian(length.data(), length_bytes);
  if (header_length > (1u << 20))
    CAIRN_THROW(BadInput, path, ": .npy header of ", header_length, " bytes (more than 1 MiB)");
  const std::vector<uint8_t> header = file.read(prefix, header_length, "the .npy header");
  const std::string text(header.begin(), header.end());
  HeaderParser parser(text, path);
  const std::map<std::string, std::string> dict = parser.dict();
  for (const auto& [key, value] : dict)
    if (key != "descr" && key != "fortran_order" && key != "shape")
      parser.fail("has the key '" + key + "' (expected descr, fortran_order and shape)");
  for (const char* key : {"descr", "fortran_order", "shape"})
    if (!dict.count(key)) parser.fail(std::string("lacks the key '") + key + "'");

  NpyArray a;
  const std::string& descr = dict.at("descr");
  if (descr.size() < 2 || descr.front() != '\'')
    parser.fail("descr is not a plain dtype string (structured dtypes are not read)");
  a.descr = descr.substr(1, descr.size() - 2);
  if (dict.at("fortran_order") != "False")
    CAIRN_THROW(BadInput, path, ": .npy array is in Fortran order (fortran_order ",
                dict.at("fortran_order"), "); save it with numpy.ascontiguousarray");
  static const std::map<std::string, std::pair<char, int>> kDescrs = {
      {"|b1", {'b', 1}}, {"|i1", {'i', 1}}, {"<i2", {'i', 2}}, {"<i4", {'i', 4}},
      {"<i8", {'i', 8}}, {"|u1", {'u', 1}}, {"<u2", {'u', 2}}, {"<u4", {'u', 4}},
      {"<u8", {'u', 8}}, {"<f2", {'f', 2}}, {"<f4", {'f', 4}}, {"<f8", {'f', 8}}};
  auto it = kDescrs.find(a.descr);
  if (it == kDescrs.end())
    CAIRN_THROW(BadInput, path, ": .npy dtype '", a.descr,
                "' is not read (little-endian bool, int8-64, uint8-64 and float16-64 are)");
  a.kind = it->second.first;
  a.item_size = it->second.second;

  const std::string& shape = dict.at("shape");
  if (shape.size() < 2 || shape.front() != '(') parser.fail("shape is not a tuple");
  uint64_t elements = 1;
  const std::string inner = shape.substr(1, shape.size() - 2);
  size_t start = 0;
  while (start < inner.size()) {
    size_t comma = inner.find(',', start);
    if (comma == std::string::npos) comma = inner.size();
    const std::string digits = inner.substr(start, comma - start);
    if (digits.size() > 18) parser.fail("shape has a dimension too large");
    const uint64_t d = std::stoull(digits);
    a.shape.push_back(int64_t(d));
    if (d != 0 && elements > (uint64_t(1) << 62) / d) parser.fail("shape has too many elements");
    elements *= d;
    start = comma + 1;
  }
  a.elements = int64_t(elements);
  a.data_offset = prefix + header_length;
  const uint64_t bytes = elements * uint64_t(a.item_size);
  if (file.size() - a.data_offset != bytes)
    CAIRN_THROW(BadInput, path, ": .npy header promises ", bytes, " bytes of data (shape ", shape,
                " of ", a.descr, ") but the file holds ", file.size() - a.data_offset,
                file.size() - a.data_offset < bytes ? " (truncated)" : "");
  return a;
}

std::optional<torch::ScalarType> wireDtypeOf(const NpyArray& a) {
  switch (a.kind) {
    case 'b':
      return torch::kBool;
    case 'u':
      if (a.item_size == 1) return torch::kByte;
      return std::nullopt;
    case 'i':
      if (a.item_size == 4) return torch::kInt;
      if (a.item_size == 8) return torch::kLong;
      return std::nullopt;
    case 'f':
      if (a.item_size == 2) return torch::kHalf;
      if (a.item_size == 4) return torch::kFloat;
      return torch::kDouble;
  }
  return std::nullopt;
}

}  // namespace cairn
