// SendPacer (core/SendPacer.h) on a clock the test moves: senders that wait exactly as told never
// exceed rate × elapsed + burst (+ the message that crosses it), and a long stream takes the time
// its bytes need at the rate, less the burst; several threads share one schedule.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "core/SendPacer.h"

namespace cairn {
namespace {

using Clock = SendPacer::Clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST(SendPacer, AStreamStaysWithinRateTimesTimePlusBurstAndTakesTheTimeItsBytesNeed) {
  for (const double mbps : {0.5, 8.0, 200.0}) {
    const uint64_t burst = 64 * 1024;
    Clock::time_point now{};  // the test's clock
    SendPacer pacer(mbps, burst, [&] { return now; });
    const Clock::time_point start = now;
    std::mt19937 draw(7);
    uint64_t sent = 0;
    for (int i = 0; i < 2000; ++i) {
      const uint64_t bytes = 1 + draw() % (256 * 1024);  // some larger than the burst
      now += pacer.reserve(bytes);                         // the sender waits as told
      const double allowed = mbps * 1e6 / 8 * seconds(now - start) + double(burst) + double(bytes);
      ASSERT_LE(double(sent + bytes), allowed + 1) << mbps << " Mbit/s, message " << i;
      sent += bytes;
      if (i % 100 == 99) now += std::chrono::microseconds(draw() % 1000);  // a sender's own pause
    }
    EXPECT_EQ(pacer.reservedBytes(), sent);
    // No slack beyond the pauses: the stream ends when its bytes (less the burst) are due.
    const double needed = double(sent) * 8 / (mbps * 1e6);
    EXPECT_NEAR(seconds(now - start), needed, needed * 0.01 + 0.02 + double(burst) * 8 / (mbps * 1e6))
        << mbps << " Mbit/s";
  }
}

TEST(SendPacer, AQuietStretchAllowsOnlyTheBurstAtOnce) {
  Clock::time_point now{};
  SendPacer pacer(8.0, 1000, [&] { return now; });  // 1 byte per microsecond
  now += std::chrono::seconds(10);                   // a long quiet stretch saves no more than the burst
  EXPECT_EQ(pacer.reserve(1000), Clock::duration::zero());
  EXPECT_EQ(pacer.reserve(1000), Clock::duration::zero());  // the burst
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::microseconds>(pacer.reserve(500)).count(), 1000);
}

TEST(SendPacer, ThreadsShareOneSchedule) {
  Clock::time_point base{};
  std::atomic<int64_t> waited_us{0};
  SendPacer pacer(8.0, 0, [&] { return base; });  // the clock stands still: every wait adds up
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i)
        waited_us += std::chrono::duration_cast<std::chrono::microseconds>(pacer.reserve(100)).count();
    });
  for (auto& t : threads) t.join();
  // 1000 reservations of 100 µs each on a standing clock: waits 0, 100, …, 99 900 µs.
  EXPECT_EQ(waited_us.load(), int64_t(100) * 999 * 1000 / 2);
  EXPECT_EQ(pacer.reservedBytes(), 100000u);
}

// untilMayGo() is how long a caller that cannot wait (the relay's loop) may sleep: the first moment
// mayGoNow() says yes, and exactly the wait reserve() would have told a sender, on the test's clock.
TEST(SendPacer, UntilMayGoIsTheFirstMomentMayGoNowSaysYes) {
  Clock::time_point now{};
  SendPacer pacer(8.0, 1000, [&] { return now; });  // 1 byte per microsecond, a burst of 1000
  EXPECT_EQ(pacer.untilMayGo(), Clock::duration::zero());
  EXPECT_EQ(pacer.reserve(1000), Clock::duration::zero());  // the burst
  EXPECT_EQ(pacer.reserve(3000), Clock::duration::zero());  // starts within the burst: due later
  const Clock::duration wait = pacer.untilMayGo();
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::microseconds>(wait).count(), 3000);
  EXPECT_FALSE(pacer.mayGoNow());
  EXPECT_EQ(pacer.untilMayGo(), wait);  // asking reserves nothing
  now += wait - std::chrono::microseconds(1);
  EXPECT_FALSE(pacer.mayGoNow());
  EXPECT_EQ(pacer.untilMayGo(), std::chrono::microseconds(1));
  now += std::chrono::microseconds(1);
  EXPECT_TRUE(pacer.mayGoNow());
  EXPECT_EQ(pacer.untilMayGo(), Clock::duration::zero());
  EXPECT_EQ(pacer.reserve(10), Clock::duration::zero());  // what reserve() says agrees
  EXPECT_EQ(pacer.reservedBytes(), 4010u);
}

}  // namespace
}  // namespace cairn
