#include "coordinator/TerminalView.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "trainer/Metrics.h"

namespace cairn::coordinator {
namespace {

std::string fixed(const nlohmann::json& v, int digits) {
  if (!v.is_number()) return "-";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, v.get<double>());
  return buffer;
}

std::string clusterLine(const nlohmann::json& c) {
  std::ostringstream line;
  line << "cluster " << c["id"].get<int>() << ": step " << c["step"].get<int64_t>();
  if (c["max_steps"].is_number()) line << "/" << c["max_steps"].get<int64_t>();
  line << "  loss " << fixed(c["loss"], 4) << "  " << fixed(c["samples_per_s"], 0) << " samples/s  ETA "
       << (c["eta_s"].is_number() ? formatDuration(c["eta_s"].get<double>()) : std::string("?"));
  line << "  [";
  for (size_t i = 0; i < c["nodes"].size(); ++i)
    line << (i ? " > " : "") << printable(c["nodes"][i].get<std::string>());
  line << "]";
  return line.str();
}

std::string nodeLine(const nlohmann::json& n) {
  char buffer[512];
  const std::string stage = n["stage"].is_number() ? std::to_string(n["stage"].get<int>()) : "-";
  const std::string cluster = n["cluster"].is_number() ? std::to_string(n["cluster"].get<int>()) : "-";
  const std::string age = n["heartbeat_age_s"].is_number() ? fixed(n["heartbeat_age_s"], 1) + "s" : "-";
  std::snprintf(buffer, sizeof buffer, "  %-14s c%-2s s%-2s %-5s %-10s hb %-7s step %-7lld compute %s send %s wait %s  %s",
                printable(n["name"].get<std::string>()).c_str(), cluster.c_str(), stage.c_str(),
                n["role"].get<std::string>().c_str(), printable(n["state"].get<std::string>()).c_str(),
                age.c_str(), (long long)n["step"].get<int64_t>(), fixed(n["compute_s"], 3).c_str(),
                fixed(n["send_s"], 3).c_str(), fixed(n["wait_s"], 3).c_str(),
                printable(n["address"].get<std::string>()).c_str());
  return buffer;
}

std::string eventLine(const nlohmann::json& e) {
  char when[32] = "";
  const std::time_t t = std::time_t(e["t"].get<double>());
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(when, sizeof when, "%H:%M:%S", &tm);
  return std::string("  ") + when + " " + printable(e["node"].get<std::string>()) + " " +
         printable(e["kind"].get<std::string>()) + ": " + printable(e["message"].get<std::string>());
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out = text;
  for (char& c : out)
    if ((unsigned char)c < 0x20 || c == 0x7f) c = '?';
  return out;
}

std::string renderRunView(const nlohmann::json& snap, bool tty, double events_after) {
  std::ostringstream out;
  const auto& run = snap["run"];
  out << "run " << run["phase"].get<std::string>() << ": " << run["members"].get<int64_t>()
      << " volunteers, " << run["num_clusters"].get<int>() << " cluster(s), "
      << run["records"].get<uint64_t>() << " records (" << run["dropped"].get<int64_t>()
      << " dropped by volunteers)\n";
  for (const auto& c : snap["clusters"]) out << clusterLine(c) << "\n";
  for (const auto& n : snap["nodes"]) out << nodeLine(n) << "\n";
  const auto& events = snap["events"];
  if (tty) {
    const size_t first = events.size() > 8 ? events.size() - 8 : 0;
    if (!events.empty()) out << "events:\n";
    for (size_t i = first; i < events.size(); ++i) out << eventLine(events[i]) << "\n";
  } else {
    for (const auto& e : events)
      if (e["t"].get<double>() > events_after) out << "event" << eventLine(e).substr(1) << "\n";
  }
  return out.str();
}

TerminalView::TerminalView(const RunView& view, std::chrono::milliseconds every)
    : view_(view), every_(every), tty_(::isatty(STDOUT_FILENO) == 1) {
  thread_ = std::thread([this] { run(); });
}

TerminalView::~TerminalView() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TerminalView::run() {
  size_t drawn_lines = 0;
  double events_after = -1;
  std::unique_lock<std::mutex> lock(mutex_);
  for (bool last = false; !last;) {
    last = wake_.wait_for(lock, every_, [this] { return stop_; });  // stopping: one last frame
    const nlohmann::json snap = view_.snapshot();
    const std::string text = renderRunView(snap, tty_, events_after);
    if (!snap["events"].empty()) events_after = snap["events"].back()["t"].get<double>();
    std::string frame;
    // Redraw in place: up over the block drawn last time, clear to the end of the screen. (Log
    // lines go to stderr: on the same terminal one printed in between may be drawn over.)
    if (tty_ && drawn_lines > 0) frame = "\033[" + std::to_string(drawn_lines) + "F\033[J";
    frame += text;
    drawn_lines = size_t(std::count(text.begin(), text.end(), '\n'));
    std::fwrite(frame.data(), 1, frame.size(), stdout);
    std::fflush(stdout);
  }
}

}  // namespace cairn::coordinator
