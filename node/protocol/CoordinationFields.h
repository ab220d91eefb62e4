// CoordinationFields: the coordination decoders' field access (Coordination.cpp and
// VolunteerProbeCodec.cpp): each accessor checks one key of a JSON object and records the first
// problem as "<type>: \"<key>\" must be <what>" instead of throwing; later accessors then do
// nothing. Internal to node/protocol/. Thread-safety: one object per decode.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace cairn::coordination_detail {

class Fields {
 public:
  Fields(const nlohmann::json& j, std::string type, std::string* why)
      : j_(j), type_(std::move(type)), why_(why) {}
  bool ok() const { return ok_; }

  std::string string(const char* key, size_t max_bytes, bool allow_empty = false) {
    if (!ok_) return {};
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_string()) return fail(key, "a string");
    std::string v = it->get<std::string>();
    if (v.size() > max_bytes) return fail(key, "at most " + std::to_string(max_bytes) + " bytes");
    if (!allow_empty && v.empty()) return fail(key, "a non-empty string");
    return v;
  }
  std::string optionalString(const char* key, size_t max_bytes) {
    if (!ok_ || !j_.contains(key)) return {};
    return string(key, max_bytes, /*allow_empty=*/true);
  }
  int64_t integer(const char* key, int64_t min, int64_t max) {
    if (!ok_) return 0;
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number_integer()) {
      fail(key, "an integer");
      return 0;
    }
    const int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX)
                          ? INT64_MAX
                          : it->get<int64_t>();
    if (v < min || v > max) {
      fail(key, "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
      return 0;
    }
    return v;
  }
  uint64_t unsignedInteger(const char* key) {
    if (!ok_) return 0;
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number_unsigned()) {
      fail(key, "a non-negative integer");
      return 0;
    }
    return it->get<uint64_t>();
  }
  double number(const char* key) {
    if (!ok_) return 0;
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_number() || !std::isfinite(it->get<double>())) {
      fail(key, "a finite number");
      return 0;
    }
    return it->get<double>();
  }
  bool boolean(const char* key) {
    if (!ok_) return false;
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_boolean()) {
      fail(key, "true or false");
      return false;
    }
    return it->get<bool>();
  }
  bool optionalBoolean(const char* key) {  // absent: false
    if (!ok_ || !j_.contains(key)) return false;
    return boolean(key);
  }
  nlohmann::json object(const char* key) {
    if (!ok_) return {};
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_object()) {
      fail(key, "an object");
      return {};
    }
    return *it;
  }

  // Records "<type>: \"<key>\" must be <expected>" unless a problem is recorded already.
  std::string fail(const char* key, const std::string& expected) {
    if (ok_ && why_) *why_ = type_ + ": \"" + key + "\" must be " + expected;
    ok_ = false;
    return {};
  }
  // Records `problem` as it is (a message that names its key itself).
  void failWith(const std::string& problem) {
    if (ok_ && why_) *why_ = problem;
    ok_ = false;
  }

 private:
  const nlohmann::json& j_;
  std::string type_;
  std::string* why_;
  bool ok_ = true;
};

}  // namespace cairn::coordination_detail
