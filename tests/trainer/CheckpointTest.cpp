// trainer/Checkpoint: round trip of every dtype against the tensors written; truncated, flipped,
// garbage, misnamed and leftover temporary files are skipped/rejected with a message naming the
// file; keep leaves exactly the newest checkpoints.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/Error.h"
#include "trainer/Checkpoint.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() /
            ("cairn_ckpt_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static CheckpointData sample(int64_t step) {
    torch::manual_seed(step);
    CheckpointData d;
    d.step = step;
    d.tensors = {
        {"stage.w", torch::randn({3, 4}, torch::kFloat)},
        {"stage.d", torch::randn({5}, torch::kDouble)},
        {"stage.h", torch::randn({2, 2}).to(torch::kHalf)},
        {"stage.b", torch::randn({2, 3}).to(torch::kBFloat16)},
        {"stage.bn.num_batches_tracked", torch::tensor(int64_t(step))},
        {"optim.0.step", torch::tensor({7, -3}, torch::kInt)},
        {"x.i16", torch::tensor({-5, 9}, torch::kShort)},
        {"x.i8", torch::tensor({-128, 127}, torch::kChar)},
        {"rng.cpu", torch::randint(0, 256, {16}, torch::kByte)},
        {"x.bool", torch::tensor({true, false, true})},
        {"x.empty", torch::empty({0, 3})},
    };
    d.meta = {{"node", "node_1"}, {"job", "j"}, {"cursor", {{"epoch", 1}, {"position", 2}}}};
    return d;
  }
  std::string path(int64_t step) const { return checkpointPath(dir_, step); }
  std::string dir_;
};

// The message of the BadInput readCheckpoint throws, "" when it reads fine.
std::string readError(const std::string& dir, int64_t step) {
  try {
    readCheckpoint(dir, step);
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

TEST_F(CheckpointFiles, RoundTripKeepsEveryDtypeShapeAndMeta) {
  const CheckpointData written = sample(4);
  writeCheckpoint(dir_, written, 3);
  EXPECT_EQ(path(4), dir_ + "/step_4.ckpt");
  const CheckpointData read = readCheckpoint(dir_, 4);
  EXPECT_EQ(read.step, 4);
  ASSERT_EQ(read.tensors.size(), written.tensors.size());
  for (size_t i = 0; i < read.tensors.size(); ++i) {
    SCOPED_TRACE(written.tensors[i].first);
    EXPECT_EQ(read.tensors[i].first, written.tensors[i].first);
    EXPECT_EQ(read.tensors[i].second.scalar_type(), written.tensors[i].second.scalar_type());
    EXPECT_EQ(read.tensors[i].second.sizes(), written.tensors[i].second.sizes());
    EXPECT_TRUE(torch::equal(read.tensors[i].second, written.tensors[i].second));
  }
  EXPECT_EQ(read.meta["node"], "node_1");
  EXPECT_EQ(read.meta["cursor"]["position"], 2);
  EXPECT_EQ(validCheckpointSteps(dir_), std::vector<int64_t>{4});
  EXPECT_EQ(validCheckpointSteps(dir_ + "/missing"), std::vector<int64_t>{});
}

TEST_F(CheckpointFiles, KeepLeavesExactlyTheNewest) {
  for (int64_t s : {2, 4, 6, 8, 10}) writeCheckpoint(dir_, sample(s), 3);
  EXPECT_EQ(validCheckpointSteps(dir_), (std::vector<int64_t>{6, 8, 10}));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) ++files, (void)e;
  EXPECT_EQ(files, 3);
  EXPECT_NE(readError(dir_, 2).find("no such checkpoint"), std::string::npos);
  // A run resumed from step 6 writes step 7: 8 and 10 belong to the abandoned continuation.
  writeCheckpoint(dir_, sample(7), 3);
  EXPECT_EQ(validCheckpointSteps(dir_), (std::vector<int64_t>{6, 7}));
}

// provider --join: the coordinator's keep_from also keeps every checkpoint from that step on (the
// one a spare may be given), beyond the newest `keep`; it may rise between writes.
TEST_F(CheckpointFiles, KeepFromAlsoKeepsEveryStepFromIt) {
  for (int64_t s : {2, 4, 6, 8, 10, 12}) writeCheckpoint(dir_, sample(s), 2, /*keep_from=*/4);
  EXPECT_EQ(validCheckpointSteps(dir_), (std::vector<int64_t>{4, 6, 8, 10, 12}));
  writeCheckpoint(dir_, sample(14), 2, 10);
  EXPECT_EQ(validCheckpointSteps(dir_), (std::vector<int64_t>{10, 12, 14}));
  writeCheckpoint(dir_, sample(16), 2, -1);  // not said: only the newest 2
  EXPECT_EQ(validCheckpointSteps(dir_), (std::vector<int64_t>{14, 16}));
}

TEST_F(CheckpointFiles, CorruptFilesAreSkippedWithAWarningAndRefused) {
  for (int64_t s : {1, 2, 3, 4, 5}) writeCheckpoint(dir_, sample(s), 10);
  // 1: truncated in the data section; 2: one data byte flipped; 3: garbage; 4: a copy of 5 under
  // the wrong name; 5 stays good. Plus a leftover temporary file from a crash.
  const auto size = fs::file_size(path(1));
  fs::resize_file(path(1), size - 10);
  {
    std::fstream f(path(2), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = char(f.get());
    f.seekp(-3, std::ios::end);
    f.put(char(c ^ 0x10));
  }
  std::ofstream(path(3), std::ios::trunc) << "this is not a checkpoint at all, just some text";
  fs::copy_file(path(5), path(4), fs::copy_options::overwrite_existing);
  std::ofstream(path(6) + ".tmp") << "half a file";

  ::testing::internal::CaptureStderr();
  const std::vector<int64_t> valid = validCheckpointSteps(dir_);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(valid, std::vector<int64_t>{5});
  for (int64_t s : {1, 2, 3, 4})
    EXPECT_NE(log.find("skipping checkpoint " + path(s)), std::string::npos) << log;
  EXPECT_EQ(log.find("step_6"), std::string::npos) << "a .tmp file is no checkpoint: " << log;

  EXPECT_NE(readError(dir_, 1).find(path(1)), std::string::npos);
  EXPECT_NE(readError(dir_, 1).find("data section"), std::string::npos) << readError(dir_, 1);
  EXPECT_NE(readError(dir_, 2).find("checksum mismatch"), std::string::npos) << readError(dir_, 2);
  EXPECT_NE(readError(dir_, 2).find(path(2)), std::string::npos);
  EXPECT_NE(readError(dir_, 3).find(path(3)), std::string::npos);
  EXPECT_NE(readError(dir_, 4).find("named for step 4"), std::string::npos) << readError(dir_, 4);
  EXPECT_EQ(readError(dir_, 5), "");
  EXPECT_NE(readError(dir_, 6).find("no such checkpoint"), std::string::npos);

  // The next write clears the leftover temporary file.
  writeCheckpoint(dir_, sample(7), 10);
  EXPECT_FALSE(fs::exists(path(6) + ".tmp"));
}

TEST_F(CheckpointFiles, FlippedMetaIsDetected) {
  writeCheckpoint(dir_, sample(3), 3);
  // Change a value inside the header's JSON without breaking its syntax: "node_1" -> "node_7".
  std::string bytes;
  {
    std::ifstream in(path(3), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = bytes.find("node_1");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] = '7';
  std::ofstream(path(3), std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_NE(readError(dir_, 3).find("checksum mismatch"), std::string::npos) << readError(dir_, 3);
  EXPECT_TRUE(validCheckpointSteps(dir_).empty());
}

// A figure, not a timing assertion: write and read-back time of a 64 MiB checkpoint (CRC-32, fsync
// of file and folder included); the round trip is checked.
TEST_F(CheckpointFiles, FigureLargeCheckpointWriteAndRead) {
  CheckpointData d;
  d.step = 1;
  d.tensors = {{"stage.big", torch::randn({16, 1024, 1024})}};
  const auto t0 = std::chrono::steady_clock::now();
  writeCheckpoint(dir_, d, 3);
  const auto t1 = std::chrono::steady_clock::now();
  const CheckpointData r = readCheckpoint(dir_, 1);
  const auto t2 = std::chrono::steady_clock::now();
  EXPECT_TRUE(torch::equal(r.tensors.at(0).second, d.tensors[0].second));
  const double mib = double(fs::file_size(path(1))) / (1 << 20);
  std::printf("[ figure ] checkpoint of %.1f MiB: write %.3f s, read+verify %.3f s\n", mib,
              std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
}

}  // namespace
}  // namespace cairn
