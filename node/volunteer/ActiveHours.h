// ActiveHours: when a volunteer computes (`provider --join --active-hours 22:00-07:00`, local
// time; docs/OPERATIONS.md "Running as a service"). A window of minutes of the day, begin
// included and end excluded, that may cross midnight; the clock that reads the local time is
// replaceable (tests: CAIRN_TEST_CLOCK names a file holding "HH:MM", read at every look).
// Thread-safety: the window is immutable; the clocks may be called from any thread.
#pragma once

#include <functional>
#include <string>

namespace cairn {

class ActiveHours {
 public:
  // "HH:MM-HH:MM" (00:00 to 23:59, begin != end); BadInput naming `what` (the flag) otherwise.
  static ActiveHours parse(const std::string& text, const std::string& what);
  // True when `minute_of_day` (0..1439) lies in the window.
  bool contains(int minute_of_day) const;
  // Minutes from `minute_of_day` until the window next begins (0 inside it).
  int minutesUntilBegin(int minute_of_day) const;
  const std::string& text() const { return text_; }

 private:
  int begin_ = 0, end_ = 0;  // minutes of the day
  std::string text_;
};

// The minute of the day now in this machine's local time (the TZ environment variable and
// /etc/localtime, as localtime_r reads them).
int localMinuteOfDay();
// The clock a volunteer reads: localMinuteOfDay, or with CAIRN_TEST_CLOCK set, the "HH:MM" in
// that file at every call (a missing or malformed file: BadInput naming it).
std::function<int()> volunteerClock();

}  // namespace cairn
