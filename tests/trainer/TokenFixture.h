// The token fixture shared by TokenDatasetTest and ServedDatasetTest: the token files
// tests/trainer/make_token_files.py writes (llm.c shards, llama3 shards, .npy, headerless files,
// broken files, numpy's reference samples) and the data options that read them.
#pragma once

#include <string>

#include "tests/trainer/DatasetTestSupport.h"
#include "trainer/Dataset.h"

namespace cairn::testing {

// The folder make_token_files.py wrote (once per process: datasetFixture).
inline std::string tokenFiles() { return datasetFixture("make_token_files.py"); }

// data.format "tokens" at `location`: blocks of 16 tokens, no test split.
inline DataOptions tokens(const std::string& location) {
  DataOptions o;
  o.format = "tokens";
  o.location = location;
  o.block_length = 16;
  o.test_fraction = 0;
  return o;
}

}  // namespace cairn::testing
