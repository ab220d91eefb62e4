// Scratch folders for tests. scratchDir("store_close") makes a fresh, empty folder
// $TMPDIR/cairn_store_close_<pid> (removing what an earlier process of the same pid left there) and
// returns its path. The folder belongs to the test that is running when it is made: it is removed
// when that test ends having passed, and kept, its path printed, when the test failed (what it holds
// is the evidence). A folder made outside any test (a suite's SetUpTestSuite, a static) is removed
// when the whole program passed. Before this, each test file made its folders its own way and many
// never removed them: every suite run left ~35 folders in /tmp.
//
// The removal is a GoogleTest event listener that this header appends to the program's listeners
// before main() runs (an inline variable: once per program, whichever files include it).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace cairn::testing {
namespace scratch_detail {

struct Made {
  const ::testing::TestInfo* test;  // null: made outside a test
  std::string path;
};

inline std::mutex& mutex() {
  static std::mutex m;
  return m;
}

inline std::vector<Made>& made() {
  static std::vector<Made> all;
  return all;
}

// Removes (or keeps, when `passed` is false) the folders of `test`; nullptr: those made outside one.
inline void settle(const ::testing::TestInfo* test, bool passed, const char* why) {
  std::vector<std::string> mine;
  {
    std::lock_guard<std::mutex> lock(mutex());
    auto& all = made();
    for (auto it = all.begin(); it != all.end();) {
      if (it->test == test) {
        mine.push_back(std::move(it->path));
        it = all.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& path : mine) {
    if (passed) {
      std::error_code ignored;  // a folder the test removed itself is fine
      std::filesystem::remove_all(path, ignored);
    } else {
      std::fprintf(stderr, "scratch folder kept (%s): %s\n", why, path.c_str());
    }
  }
}

class Cleaner : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& test) override {
    settle(&test, !test.result()->Failed(), "the test failed");
  }
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    settle(nullptr, unit.Passed(), "a test failed");
  }
};

inline const bool kCleanerAppended = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new Cleaner);  // GoogleTest owns it
  return true;
}();

}  // namespace scratch_detail

inline std::string scratchDir(const std::string& name) {
  namespace fs = std::filesystem;
  const std::string dir =
      (fs::temp_directory_path() / ("cairn_" + name + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::lock_guard<std::mutex> lock(scratch_detail::mutex());
  scratch_detail::made().push_back(
      {::testing::UnitTest::GetInstance()->current_test_info(), dir});
  return dir;
}

}  // namespace cairn::testing
