#include "core/JsonReader.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cairn {

nlohmann::json readJsonFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    CAIRN_THROW(BadInput, path, ": is a directory, expected a JSON file");
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot open (does the file exist and is it readable?)");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find_first_not_of(" \t\r\n") == std::string::npos)
    CAIRN_THROW(BadInput, path, ": is empty, expected a JSON document");
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is the offset of the failure; turn it into line:column for the user.
    const std::string s = text.str();
    size_t line = 1, column = 1;
    for (size_t i = 0; i + 1 < e.byte && i < s.size(); ++i) {
      if (s[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    CAIRN_THROW(BadInput, path, ": not valid JSON at line ", line, " column ", column);
  }
}

void writeJsonFile(const std::string& path, const nlohmann::json& value) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) CAIRN_THROW(BadInput, path, ": cannot write (is the folder writable?)");
    out << value.dump(2) << '\n';
    out.flush();
    if (!out) CAIRN_THROW(BadInput, path, ": write failed (disk full?)");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    CAIRN_THROW(BadInput, path, ": cannot replace the file");
  }
}

void writeFileDurably(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.close();
    if (!f) CAIRN_THROW(InternalError, tmp, ": cannot write");
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    CAIRN_THROW(InternalError, tmp, ": cannot fsync: ", std::strerror(errno));
  }
  ::close(fd);
  std::filesystem::rename(tmp, path);
}

std::string jsonTypeName(const nlohmann::json& value) {
  if (value.is_number()) return "number";
  return value.type_name();
}

JsonReader::JsonReader(const nlohmann::json& value, std::string context, std::string prefix)
    : value_(value), context_(std::move(context)), prefix_(std::move(prefix)) {
  if (!value_.is_object()) {
    CAIRN_THROW(BadInput, context_, ": ", prefix_.empty() ? "the document" : prefix_,
                " must be an object (got ", jsonTypeName(value_), ")");
  }
}

std::string JsonReader::path(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "." + key;
}

void JsonReader::fail(const std::string& key, const std::string& what) const {
  CAIRN_THROW(BadInput, context_, ": ", path(key), " ", what);
}

const nlohmann::json* JsonReader::find(const std::string& key) const {
  auto it = value_.find(key);
  if (it == value_.end() || it->is_null()) return nullptr;
  return &*it;
}

const nlohmann::json& JsonReader::require(const std::string& key) const {
  const nlohmann::json* v = find(key);
  if (!v) CAIRN_THROW(BadInput, context_, ": missing key ", path(key));
  return *v;
}

bool JsonReader::has(const std::string& key) const { return find(key) != nullptr; }

std::string JsonReader::string(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_string()) fail(key, "must be a string (got " + jsonTypeName(v) + ")");
  return v.get<std::string>();
}

std::optional<std::string> JsonReader::optionalString(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

std::string JsonReader::stringOr(const std::string& key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

std::string JsonReader::choice(const std::string& key,
                               const std::vector<std::string>& choices) const {
  std::string v = string(key);
  for (const auto& c : choices)
    if (c == v) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  fail(key, "must be one of " + list + " (got \"" + v + "\")");
}

std::string JsonReader::choiceOr(const std::string& key, const std::vector<std::string>& choices,
                                 const std::string& fallback) const {
  return has(key) ? choice(key, choices) : fallback;
}

double JsonReader::number(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_number()) fail(key, "must be a number (got " + jsonTypeName(v) + ")");
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(key, "must be a finite number");
  return d;
}

double JsonReader::numberOr(const std::string& key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

std::optional<double> JsonReader::optionalNumber(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return number(key);
}

double JsonReader::positiveNumber(const std::string& key) const {
  const double d = number(key);
  if (!(d > 0)) fail(key, "must be a positive number (got " + require(key).dump() + ")");
  return d;
}

double JsonReader::nonNegativeNumber(const std::string& key) const {
  const double d = number(key);
  if (d < 0) fail(key, "must be zero or a positive number (got " + require(key).dump() + ")");
  return d;
}

double JsonReader::nonNegativeNumberOr(const std::string& key, double fallback) const {
  return has(key) ? nonNegativeNumber(key) : fallback;
}

int64_t JsonReader::integer(const std::string& key, int64_t min, int64_t max) const {
  const auto& v = require(key);
  int64_t result = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(key, "is too large (got " + v.dump() + ")");
    }
    result = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15) {
    result = static_cast<int64_t>(v.get<double>());  // 3.0 is an integer too
  } else {
    fail(key, "must be an integer (got " + (v.is_number() ? v.dump() : jsonTypeName(v)) + ")");
  }
  if (result < min || result > max) {
    fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max) + " (got " +
                  std::to_string(result) + ")");
  }
  return result;
}

int64_t JsonReader::integerOr(const std::string& key, int64_t min, int64_t max,
                              int64_t fallback) const {
  return has(key) ? integer(key, min, max) : fallback;
}

bool JsonReader::boolean(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_boolean()) fail(key, "must be true or false (got " + jsonTypeName(v) + ")");
  return v.get<bool>();
}

bool JsonReader::booleanOr(const std::string& key, bool fallback) const {
  return has(key) ? boolean(key) : fallback;
}

std::vector<int64_t> JsonReader::integerList(const std::string& key, int64_t min,
                                             int64_t max) const {
  const auto& v = require(key);
  if (!v.is_array()) fail(key, "must be a list of integers (got " + jsonTypeName(v) + ")");
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& e = v[i];
    if (!e.is_number_integer())
      fail(key + "[" + std::to_string(i) + "]", "must be an integer (got " + jsonTypeName(e) + ")");
    const int64_t x = e.get<int64_t>();
    if (x < min || x > max)
      fail(key + "[" + std::to_string(i) + "]", "must be between " + std::to_string(min) +
                                                    " and " + std::to_string(max) +
                                                    " (got " + std::to_string(x) + ")");
    out.push_back(x);
  }
  return out;
}

std::vector<std::string> JsonReader::stringList(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_array()) fail(key, "must be a list of strings (got " + jsonTypeName(v) + ")");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      fail(key + "[" + std::to_string(i) + "]", "must be a string (got " + jsonTypeName(v[i]) + ")");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

std::vector<double> JsonReader::numberList(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_array()) fail(key, "must be a list of numbers (got " + jsonTypeName(v) + ")");
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number() || !std::isfinite(v[i].get<double>()))
      fail(key + "[" + std::to_string(i) + "]", "must be a finite number (got " + v[i].dump() + ")");
    out.push_back(v[i].get<double>());
  }
  return out;
}

JsonReader JsonReader::object(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_object()) fail(key, "must be an object (got " + jsonTypeName(v) + ")");
  return JsonReader(v, context_, path(key));
}

std::optional<JsonReader> JsonReader::optionalObject(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return object(key);
}

std::vector<JsonReader> JsonReader::objectList(const std::string& key) const {
  const auto& v = require(key);
  if (!v.is_array()) fail(key, "must be a list (got " + jsonTypeName(v) + ")");
  std::vector<JsonReader> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string element = key + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) fail(element, "must be an object (got " + jsonTypeName(v[i]) + ")");
    out.emplace_back(v[i], context_, path(element));
  }
  return out;
}

void JsonReader::rejectUnknownKeys(const std::vector<std::string>& known) const {
  for (auto it = value_.begin(); it != value_.end(); ++it) {
    bool ok = false;
    for (const auto& k : known) ok = ok || k == it.key();
    if (!ok) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      fail(it.key(), "is not a known key (expected one of " + list + ")");
    }
  }
}

}  // namespace cairn
