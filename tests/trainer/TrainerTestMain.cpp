// trainer_tests main: one intra-op thread per process (the in-memory pipelines run stages as
// threads; oversubscribing 2 cores only slows them down).
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  at::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
