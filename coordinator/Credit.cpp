#include "coordinator/Credit.h"

#include <cmath>
#include <optional>
#include <unordered_map>

namespace cairn::coordinator {
namespace {

// Bounds no honest record reaches; a record past them is skipped, not stored.
constexpr int64_t kMaxStep = int64_t(1) << 40;
constexpr int64_t kMaxSamples = int64_t(1) << 40;
constexpr int64_t kMaxBytes = int64_t(1) << 50;
constexpr double kMaxComputeS = 1e7;

// r[key] when it is an integer in [low, high]; `absent` when r has no such key.
std::optional<int64_t> integerIn(const nlohmann::json& r, const char* key, int64_t low, int64_t high,
                                 std::optional<int64_t> absent = std::nullopt) {
  if (!r.contains(key)) return absent;
  if (!r[key].is_number_integer()) return std::nullopt;
  const int64_t v = r[key].get<int64_t>();
  if (v < low || v > high) return std::nullopt;
  return v;
}

// A step record's credit, or nullopt when it is not one (or not a valid one).
std::optional<CreditStep> stepOf(const nlohmann::json& r) {
  const auto step = integerIn(r, "step", 1, kMaxStep);
  // A provider before the figures were recorded sends neither: the step without them.
  const auto samples = integerIn(r, "samples", 0, kMaxSamples, 0);
  const auto sent = integerIn(r, "sent_bytes", 0, kMaxBytes, 0);
  if (!step || !samples || !sent || !r.contains("compute_s") || !r["compute_s"].is_number())
    return std::nullopt;
  const double compute = r["compute_s"].get<double>();
  if (!std::isfinite(compute) || compute < 0 || compute > kMaxComputeS) return std::nullopt;
  return CreditStep{*step, *samples, compute, *sent};
}

}  // namespace

size_t creditRecords(CoordinatorStore& store, const std::string& key, const std::string& node,
                     const std::vector<nlohmann::json>& records) {
  size_t skipped = 0;
  std::vector<CreditStep> steps;
  for (const nlohmann::json& r : records) {
    if (!r.is_object()) continue;
    if (r.contains("resumed_from")) {
      const auto from = integerIn(r, "resumed_from", -1, kMaxStep);
      if (!from) {
        ++skipped;
        continue;
      }
      store.creditSteps(node, key, steps);  // the steps before it, then the roll-back
      steps.clear();
      store.dropCreditAfter(node, *from);
      continue;
    }
    if (!r.contains("step")) continue;  // evaluations, checkpoints, the end: no credit
    if (const auto c = stepOf(r)) {
      steps.push_back(*c);
    } else {
      ++skipped;
    }
  }
  store.creditSteps(node, key, steps);
  return skipped;
}

void creditCheckpoint(CoordinatorStore& store, const std::string& key, const std::string& node,
                      int64_t step, int64_t planned_steps) {
  store.creditUpTo(node, key, std::min(step, planned_steps > 0 ? planned_steps : store.maxCreditedStep()));
}

nlohmann::json creditJson(const std::vector<CreditTotal>& totals, const std::vector<Member>& members) {
  std::unordered_map<std::string, std::string> names;  // key → its (last) member's name
  for (const Member& m : members) names[m.public_key] = m.name;
  nlohmann::json out = nlohmann::json::array();
  for (const CreditTotal& t : totals) {
    const auto named = names.find(t.key);
    const std::string volunteer = named == names.end() ? t.key : named->second;
    out.push_back({{"volunteer", volunteer},
                   {"key", t.key},
                   {"node", t.node},
                   {"steps", t.steps},
                   {"samples", t.samples},
                   {"compute_s", t.compute_s},
                   {"sent_bytes", t.sent_bytes}});
  }
  return out;
}

}  // namespace cairn::coordinator
