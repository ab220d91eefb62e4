// The CAIRN_TEST_HOLD hook (node/pipeline/TestHold.h) that integration tests use to hold a
// cluster's Root at a step: off without the variable, refuses a malformed value, holds only the
// named cluster at the named step, and lets it go once the file exists.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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
  for (const char* bad : {"1:5", "x:5:/f", "1:y:/f", "1:5:", "-1:5:/f", "1:-5:/f", "1a:5:/f"}) {
    setenv("CAIRN_TEST_HOLD", bad, 1);
    try {
      testHoldFromEnvironment(1, milliseconds(1000));
      FAIL() << bad << " accepted";
    } catch (const BadInput& e) {
      EXPECT_NE(std::string(e.what()).find("CAIRN_TEST_HOLD"), std::string::npos) << e.what();
    }
  }
}

TEST_F(TestHoldTest, HoldsOnlyItsStepUntilTheFileExists) {
  const auto file = std::filesystem::temp_directory_path() /
                    ("cairn_test_hold_" + std::to_string(::getpid()));
  std::filesystem::remove(file);
  setenv("CAIRN_TEST_HOLD", ("2:7:" + file.string()).c_str(), 1);
  auto hold = testHoldFromEnvironment(2, milliseconds(60000));
  ASSERT_TRUE(hold);
  hold(6, {});  // another step: returns at once (the file does not exist)
  std::atomic<bool> released{false};
  std::thread root([&] {
    hold(7, {});
    released = true;
  });
  // Held while the file is missing: the flag cannot be set before the file is written below.
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_FALSE(released.load());
  std::ofstream(file).put('\n');
  root.join();
  EXPECT_TRUE(released.load());
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace cairn
