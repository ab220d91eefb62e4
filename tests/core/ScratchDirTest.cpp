// tests/common/ScratchDir.h: a passing test's scratch folder is gone once the test has ended, and a
// folder made for the whole suite lasts until the program ends. (That a failed test's folder is
// kept cannot be checked from inside a passing run; the listener's one branch for it prints the path.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/ScratchDir.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

std::string& firstTestsFolder() {
  static std::string path;
  return path;
}

class ScratchDirs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { suite_folder = testing::scratchDir("scratch_suite"); }
  static inline std::string suite_folder;
};

TEST_F(ScratchDirs, AFolderIsMadeFreshAndEmptyAndLastsWhileItsTestRuns) {
  const std::string dir = testing::scratchDir("scratch_first");
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
  std::ofstream(dir + "/file") << "kept while the test runs";
  EXPECT_EQ(testing::scratchDir("scratch_first"), dir);  // made again: fresh, empty
  EXPECT_TRUE(fs::is_empty(dir));
  std::ofstream(dir + "/file") << "removed when the test ends";
  EXPECT_TRUE(fs::exists(dir + "/file"));
  firstTestsFolder() = dir;
}

TEST_F(ScratchDirs, APassingTestsFolderIsGoneOnceItEndedTheSuitesStays) {
  if (firstTestsFolder().empty()) GTEST_SKIP() << "the first test did not run before this one";
  EXPECT_FALSE(fs::exists(firstTestsFolder()));
  EXPECT_TRUE(fs::is_directory(suite_folder));
}

}  // namespace
}  // namespace cairn
