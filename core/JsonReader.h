// Validated reading of JSON documents that come from users or peers. Every accessor names the file,
// the entity and the (dotted) key in its error, e.g.
//   node_configs.json: node "3": benchmarks.ram must be a positive number (got -4)
// and throws BadInput. A JsonReader refers to the json it was given; keep that alive.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/Error.h"

namespace cairn {

// Reads a whole file as JSON. Missing file, unreadable file and syntax errors are BadInput that
// name the path (and line/column for syntax errors).
nlohmann::json readJsonFile(const std::string& path);
// Writes JSON atomically (temporary file + rename), pretty-printed with 2 spaces.
void writeJsonFile(const std::string& path, const nlohmann::json& value);
// `bytes` into `path` so that a crash leaves the old file or the whole new one: written to a
// temporary beside it, fsync'd, renamed over it (InternalError naming the file if it cannot be).
void writeFileDurably(const std::string& path, const std::string& bytes);
// "number", "string", "object", ... for messages.
std::string jsonTypeName(const nlohmann::json& value);

class JsonReader {
 public:
  // `context` prefixes every message, e.g. "node_configs.json: node \"3\"". `prefix` is the
  // dotted path of this object inside the document ("" at the top).
  JsonReader(const nlohmann::json& value, std::string context, std::string prefix = "");

  bool has(const std::string& key) const;
  const nlohmann::json& raw() const { return value_; }

  std::string string(const std::string& key) const;
  std::optional<std::string> optionalString(const std::string& key) const;
  std::string stringOr(const std::string& key, const std::string& fallback) const;
  // One of `choices`; the error lists them.
  std::string choice(const std::string& key, const std::vector<std::string>& choices) const;
  std::string choiceOr(const std::string& key, const std::vector<std::string>& choices,
                       const std::string& fallback) const;

  double number(const std::string& key) const;
  double numberOr(const std::string& key, double fallback) const;
  std::optional<double> optionalNumber(const std::string& key) const;
  double positiveNumber(const std::string& key) const;          // > 0
  double nonNegativeNumber(const std::string& key) const;       // >= 0
  double nonNegativeNumberOr(const std::string& key, double fallback) const;

  // Integral JSON numbers only (1.5 is rejected), within [min, max].
  int64_t integer(const std::string& key, int64_t min, int64_t max) const;
  int64_t integerOr(const std::string& key, int64_t min, int64_t max, int64_t fallback) const;

  bool boolean(const std::string& key) const;
  bool booleanOr(const std::string& key, bool fallback) const;

  std::vector<int64_t> integerList(const std::string& key, int64_t min, int64_t max) const;
  std::vector<std::string> stringList(const std::string& key) const;
  std::vector<double> numberList(const std::string& key) const;

  JsonReader object(const std::string& key) const;
  std::optional<JsonReader> optionalObject(const std::string& key) const;
  // The elements of an array under `key`; element i reports as key[i].
  std::vector<JsonReader> objectList(const std::string& key) const;

  // Throws BadInput if the object has keys outside `known` (catches typos like "bandwith").
  void rejectUnknownKeys(const std::vector<std::string>& known) const;

  // Throws BadInput "<context>: <path(key)> <what>".
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  std::string path(const std::string& key) const;
  const std::string& context() const { return context_; }

 private:
  const nlohmann::json* find(const std::string& key) const;
  const nlohmann::json& require(const std::string& key) const;

  const nlohmann::json& value_;
  std::string context_;
  std::string prefix_;
};

}  // namespace cairn
