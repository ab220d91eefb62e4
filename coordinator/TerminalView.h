// TerminalView: the coordinator's live view of the run on its own terminal (docs/OPERATIONS.md
// "Watching a run"), drawn from RunView::snapshot() by a thread of its own every `every`, so the
// coordinator's loop never formats or prints it. On a terminal (stdout is a TTY) one block is
// redrawn in place: per cluster its step, loss, samples/s and ETA; per node its role, stage,
// state, heartbeat age and compute/send/wait split; the newest events. Otherwise plain lines
// (one per cluster and per node, and the events since the last print) every `every`, and once
// more when it stops (the coordinator's run ends).
// Volunteer text (addresses, messages) is printed with control characters replaced by '?', so a
// volunteer cannot move the cursor or recolour the terminal.
//
// Ownership: owns its thread; borrows the view (it must outlive this). Thread-safety: construct
// and destroy from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "coordinator/RunView.h"

namespace cairn::coordinator {

// The block for a terminal (`tty`) or the plain lines; `events_after`: plain lines show only the
// events with "t" greater than this.
std::string renderRunView(const nlohmann::json& snapshot, bool tty, double events_after = -1);
// `text` with control characters (and DEL) replaced by '?'.
std::string printable(const std::string& text);

class TerminalView {
 public:
  TerminalView(const RunView& view, std::chrono::milliseconds every);
  ~TerminalView();
  TerminalView(const TerminalView&) = delete;
  TerminalView& operator=(const TerminalView&) = delete;

 private:
  void run();

  const RunView& view_;
  std::chrono::milliseconds every_;
  bool tty_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cairn::coordinator
