// provider --active-hours (node/volunteer/ActiveHours.h) against a brute-force reference: the
// window marked minute by minute from its begin up to its end (wrapping at midnight), and the wait
// counted minute by minute until a marked minute; the test clock file read at every call.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/Error.h"
#include "node/volunteer/ActiveHours.h"

namespace cairn {
namespace {

TEST(ActiveHours, WindowAndWaitEqualAMinuteByMinuteWalk) {
  for (const auto& [text, begin, end] : {std::tuple{"22:00-07:00", 22 * 60, 7 * 60},
                                         std::tuple{"09:30-17:05", 9 * 60 + 30, 17 * 60 + 5},
                                         std::tuple{"00:00-23:59", 0, 23 * 60 + 59},
                                         std::tuple{"23:59-00:00", 23 * 60 + 59, 0}}) {
    const ActiveHours hours = ActiveHours::parse(text, "--active-hours");
    std::array<bool, 1440> inside{};
    for (int m = begin; m != end; m = (m + 1) % 1440) inside[size_t(m)] = true;
    for (int m = 0; m < 1440; ++m) {
      ASSERT_EQ(hours.contains(m), inside[size_t(m)]) << text << " at minute " << m;
      int wait = 0;
      while (!inside[size_t((m + wait) % 1440)]) ++wait;
      ASSERT_EQ(hours.minutesUntilBegin(m), wait) << text << " at minute " << m;
    }
  }
}

TEST(ActiveHours, MalformedWindowsAreRefusedNamingTheFlag) {
  for (const char* bad : {"", "22:00", "22:00-", "24:00-07:00", "22:60-07:00", "2200-0700",
                          "22:00-07:00x", "7:00-9:00", "08:00-08:00"}) {
    try {
      (void)ActiveHours::parse(bad, "--active-hours");
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("--active-hours \"" + std::string(bad) + "\""),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ActiveHours, TheTestClockIsReadAtEveryCall) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("cairn_clock_" + std::to_string(::getpid()))).string();
  ::setenv("CAIRN_TEST_CLOCK", path.c_str(), 1);
  const auto clock = volunteerClock();
  ::unsetenv("CAIRN_TEST_CLOCK");
  std::ofstream(path) << "07:30\n";
  EXPECT_EQ(clock(), 7 * 60 + 30);
  std::ofstream(path) << "22:05\n";
  EXPECT_EQ(clock(), 22 * 60 + 5);
  std::ofstream(path) << "later\n";
  EXPECT_THROW(clock(), BadInput);
  std::filesystem::remove(path);
  EXPECT_THROW(clock(), BadInput);
  // Without the variable: the machine's local time.
  const int now = volunteerClock()();
  EXPECT_GE(now, 0);
  EXPECT_LT(now, 1440);
}

}  // namespace
}  // namespace cairn
