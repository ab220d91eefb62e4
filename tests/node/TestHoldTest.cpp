// The CAIRN_TEST_HOLD hook (node/pipeline/TestHold.h) that integration tests use to hold a
// cluster's Root at a step: off without the variable, refuses a malformed value, holds only the
// named cluster at the named step, and lets it go once the file exists.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <unistd.h>

#include "core/Error.h"
#include "node/pipeline/TestHold.h"

namespace cairn {
namespace {

using std::chrono::milliseconds;

class TestHoldTest : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("CAIRN_TEST_HOLD"); }
};

TEST_F(TestHoldTest, OffWithoutTheVariableAndForOtherClusters) {
  unsetenv("CAIRN_TEST_HOLD");
  EXPECT_FALSE(testHoldFromEnvironment(1, milliseconds(1000)));
  setenv("CAIRN_TEST_HOLD", "1:5:/nonexistent/release", 1);
  EXPECT_FALSE(testHoldFromEnvironment(0, milliseconds(1000)));
  EXPECT_TRUE(testHoldFromEnvironment(1, milliseconds(1000)));
}

TEST_F(TestHoldTest, MalformedValueIsRefusedNamingTheVariable) {
  for (const char* bad : {"1:5", "1:5:/f,", "1:5:/f,2:x:/g", "x:5:/f", "1:y:/f", "1:5:", "-1:5:/f", "1:-5:/f", "1a:5:/f"}) {
    setenv("CAIRN_TEST_HOLD", bad, 1);
    try {
      testHoldFromEnvironment(1, milliseconds(1000));
      FAIL() << bad << " accepted";
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("CAIRN_TEST_HOLD"), std::string::npos) << e.what();
    }
  }
}

// Waits in `hold(at)` on another thread and checks it is still waiting while the release file is
// missing (it cannot return before the file is written), then writes the file.
void expectHeldUntilReleased(const std::function<void(int64_t, const std::vector<int64_t>&)>& hold,
                             int64_t at, const std::filesystem::path& release) {
  std::atomic<bool> released{false};
  std::thread root([&] {
    hold(at, {});
    released = true;
  });
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(released.load()) << "step " << at;
  std::ofstream(release).put('\n');
  root.join();
  EXPECT_TRUE(released.load());
}

std::filesystem::path scratch(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("cairn_test_hold_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove(path);
  std::filesystem::remove(path.string() + ".hold");
  return path;
}

TEST_F(TestHoldTest, HoldsAtItsStepUntilTheFileExists) {
  const auto release = scratch("step");
  setenv("CAIRN_TEST_HOLD", ("2:7:" + release.string()).c_str(), 1);
  auto hold = testHoldFromEnvironment(2, milliseconds(60000));
  ASSERT_TRUE(hold);
  hold(6, {});  // an earlier step, no .hold file: returns at once (the release file is missing)
  expectHeldUntilReleased(hold, 7, release);
  hold(8, {});  // released: every later step goes on
  std::filesystem::remove(release);
}

TEST_F(TestHoldTest, HoldsEarlierOnceTheHoldFileExists) {
  const auto release = scratch("early");
  setenv("CAIRN_TEST_HOLD", ("0:100:" + release.string()).c_str(), 1);
  auto hold = testHoldFromEnvironment(0, milliseconds(60000));
  ASSERT_TRUE(hold);
  hold(3, {});
  std::ofstream(release.string() + ".hold").put('\n');
  expectHeldUntilReleased(hold, 4, release);
  std::filesystem::remove(release);
  std::filesystem::remove(release.string() + ".hold");
}

TEST_F(TestHoldTest, SeveralHoldsAreWaitedForInTurn) {
  const auto first = scratch("first"), second = scratch("second");
  setenv("CAIRN_TEST_HOLD", ("0:3:" + first.string() + ",1:4:/nonexistent/other,0:9:" + second.string()).c_str(), 1);
  auto hold = testHoldFromEnvironment(0, milliseconds(60000));
  ASSERT_TRUE(hold);
  hold(2, {});
  expectHeldUntilReleased(hold, 3, first);
  hold(8, {});  // between the two holds: goes on
  expectHeldUntilReleased(hold, 9, second);
  hold(10, {});
  std::filesystem::remove(first);
  std::filesystem::remove(second);
}

}  // namespace
}  // namespace cairn
