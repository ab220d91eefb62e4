#include "tools/bench/coordinator_load/LoadReport.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace cairn::bench::load {
namespace {

double percentile(std::vector<float> v, double p) {
  if (v.empty()) return -1;
  const size_t k = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + long(k), v.end());
  return v[k];
}

double cpuPercent(const ProcSample& a, const ProcSample& b) {
  const double seconds = b.t - a.t;
  if (seconds <= 0) return -1;
  return 100.0 * double(b.cpu_ticks - a.cpu_ticks) / double(ticksPerSecond()) / seconds;
}

nlohmann::json latencies(const std::vector<const LoadRecorder*>& recorders, int window) {
  nlohmann::json out = nlohmann::json::object();
  for (Msg m : {Msg::kProbe, Msg::kJoin, Msg::kMetrics, Msg::kCheckpoint, Msg::kChunk, Msg::kEcho}) {
    std::vector<float> all;
    for (const LoadRecorder* r : recorders) {
      const auto& v = r->windows()[size_t(window)].latency_ms[size_t(m)];
      all.insert(all.end(), v.begin(), v.end());
    }
    if (all.empty()) continue;
    out[msgName(m)] = {{"n", all.size()},
                       {"p50_ms", percentile(all, 0.5)},
                       {"p99_ms", percentile(all, 0.99)},
                       {"max_ms", *std::max_element(all.begin(), all.end())}};
  }
  return out;
}

nlohmann::json windowJson(const RunFigures& f, const std::vector<const LoadRecorder*>& recorders,
                          int window) {
  const MeasuredWindow& w = f.windows[size_t(window - 1)];
  const double seconds = w.end.t - w.begin.t;
  nlohmann::json sent = nlohmann::json::object();
  uint64_t total = 0, replies = 0, bytes = 0, resends = 0;
  for (int m = 0; m < kMsgTypes; ++m) {
    uint64_t n = 0;
    for (const LoadRecorder* r : recorders) n += r->windows()[size_t(window)].sent[size_t(m)];
    sent[msgName(Msg(m))] = n;
    total += n;
  }
  for (const LoadRecorder* r : recorders) {
    replies += r->windows()[size_t(window)].replies;
    bytes += r->windows()[size_t(window)].sent_bytes;
    resends += r->windows()[size_t(window)].resends;
  }
  return {{"from_s", w.begin.t},
          {"to_s", w.end.t},
          {"sent", sent},
          {"messages_per_s", double(total) / seconds},
          {"replies_per_s", double(replies) / seconds},
          {"mbytes_per_s", double(bytes) / 1e6 / seconds},
          {"resends", resends},
          {"coordinator_cpu_pct", cpuPercent(w.begin, w.end)},
          {"coordinator_rss_mb", double(w.end.rss_kb) / 1024},
          {"coordinator_hwm_mb", double(w.end.hwm_kb) / 1024},
          {"load_generator_cpu_pct", cpuPercent(w.self_begin, w.self_end)},
          {"latency", latencies(recorders, window)}};
}

}  // namespace

nlohmann::json reportJson(const RunFigures& f, const std::vector<const LoadRecorder*>& recorders) {
  nlohmann::json out = {{"volunteers", f.volunteers},
                        {"accepted", f.accepted},
                        {"assigned", f.assigned},
                        {"failed", f.failed},
                        {"rejected", f.rejected},
                        {"problems", f.problems},
                        {"all_accepted_s", f.all_accepted_s},
                        {"all_assigned_s", f.all_assigned_s},
                        {"join_latency", latencies(recorders, 0)}};
  if (!f.stopped_by.empty()) out["stopped_by"] = f.stopped_by;
  out["windows"] = nlohmann::json::array();
  for (int w = 1; w <= int(f.windows.size()); ++w)
    out["windows"].push_back(windowJson(f, recorders, w));
  nlohmann::json samples = nlohmann::json::array();
  for (const ProcSample& s : f.samples) samples.push_back({s.t, s.cpu_ticks, s.rss_kb, s.hwm_kb});
  out["samples"] = {{"columns", {"t_s", "cpu_ticks", "rss_kb", "hwm_kb"}},
                    {"ticks_per_s", ticksPerSecond()},
                    {"rows", samples}};
  return out;
}

std::string reportTable(const nlohmann::json& r) {
  std::ostringstream out;
  char line[512];
  auto lat = [](const nlohmann::json& w, const char* kind) {
    if (!w["latency"].contains(kind)) return std::string("-");
    const auto& l = w["latency"][kind];
    char b[64];
    std::snprintf(b, sizeof b, "%.1f/%.1f", l["p50_ms"].get<double>(), l["p99_ms"].get<double>());
    return std::string(b);
  };
  std::snprintf(
      line, sizeof line,
      "volunteers %d: accepted %d (all in %.1f s), assigned %d (all in %.1f s), failed %d\n",
      r["volunteers"].get<int>(), r["accepted"].get<int>(), r["all_accepted_s"].get<double>(),
      r["assigned"].get<int>(), r["all_assigned_s"].get<double>(), r["failed"].get<int>());
  out << line;
  out << "window  | msgs/s | coord CPU % | RSS MB | HWM MB | metrics p50/p99 ms | checkpoint "
         "p50/p99 ms "
         "| chunk p50/p99 ms | echo p50/p99 ms | loadgen CPU %\n";
  int i = 0;
  for (const auto& w : r["windows"]) {
    std::snprintf(line, sizeof line,
                  "%3.0f-%3.0fs | %6.0f | %11.1f | %6.1f | %6.1f | %18s | %21s | %16s | %15s | %6.1f\n",
                  w["from_s"].get<double>(), w["to_s"].get<double>(),
                  w["messages_per_s"].get<double>(), w["coordinator_cpu_pct"].get<double>(),
                  w["coordinator_rss_mb"].get<double>(), w["coordinator_hwm_mb"].get<double>(),
                  lat(w, "metrics").c_str(), lat(w, "checkpoint").c_str(),
                  lat(w, "chunk_request").c_str(), lat(w, "echo").c_str(),
                  w["load_generator_cpu_pct"].get<double>());
    out << line;
    ++i;
  }
  return out.str();
}

}  // namespace cairn::bench::load
