#include "node/volunteer/ActiveHours.h"

#include <cstdlib>
#include <ctime>
#include <fstream>

#include "core/Error.h"

namespace cairn {
namespace {

// "HH:MM" as minutes of the day; -1 when it is not one.
int minuteOf(const std::string& hhmm) {
  if (hhmm.size() != 5 || hhmm[2] != ':') return -1;
  for (size_t i : {0, 1, 3, 4})
    if (hhmm[i] < '0' || hhmm[i] > '9') return -1;
  const int hours = (hhmm[0] - '0') * 10 + (hhmm[1] - '0');
  const int minutes = (hhmm[3] - '0') * 10 + (hhmm[4] - '0');
  if (hours > 23 || minutes > 59) return -1;
  return hours * 60 + minutes;
}

}  // namespace

ActiveHours ActiveHours::parse(const std::string& text, const std::string& what) {
  const size_t dash = text.find('-');
  const int begin = dash == std::string::npos ? -1 : minuteOf(text.substr(0, dash));
  const int end = dash == std::string::npos ? -1 : minuteOf(text.substr(dash + 1));
  if (begin < 0 || end < 0)
    CAIRN_THROW(BadInput, what, " \"", text, "\": expected HH:MM-HH:MM in local time (00:00 to "
                "23:59), e.g. 22:00-07:00 for the nights");
  if (begin == end)
    CAIRN_THROW(BadInput, what, " \"", text, "\": the hours begin and end at the same minute (leave "
                "the flag out to compute at all hours)");
  ActiveHours hours;
  hours.begin_ = begin;
  hours.end_ = end;
  hours.text_ = text;
  return hours;
}

bool ActiveHours::contains(int minute) const {
  if (begin_ < end_) return minute >= begin_ && minute < end_;
  return minute >= begin_ || minute < end_;  // across midnight
}

int ActiveHours::minutesUntilBegin(int minute) const {
  if (contains(minute)) return 0;
  return (begin_ - minute + 24 * 60) % (24 * 60);
}

int localMinuteOfDay() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  return local.tm_hour * 60 + local.tm_min;
}

std::function<int()> volunteerClock() {
  const char* file = std::getenv("CAIRN_TEST_CLOCK");
  if (!file || !*file) return localMinuteOfDay;
  return [path = std::string(file)] {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    const int minute = minuteOf(line.substr(0, 5));
    if (!in && line.empty())
      CAIRN_THROW(BadInput, "CAIRN_TEST_CLOCK ", path, ": cannot read it");
    if (minute < 0)
      CAIRN_THROW(BadInput, "CAIRN_TEST_CLOCK ", path, ": expected HH:MM on its first line, got \"",
                  line.substr(0, 40), "\"");
    return minute;
  };
}

}  // namespace cairn
