// A test hook, off unless the environment asks for it: CAIRN_TEST_HOLD=CLUSTER:STEP:FILE makes the
// Root of cluster CLUSTER wait before a step until FILE exists (at most `limit`, then it goes on
// with a warning): before the first step once FILE.hold exists, and before step STEP at the latest.
// Several holds, separated by commas (CLUSTER:STEP:FILE,CLUSTER:STEP:FILE), are waited for in
// turn: a test can hold a cluster first at an early step, then again at a later one.
// An integration test holds one cluster while it replaces a volunteer of another
// (tests/integration/volunteer_replace_test.py ring_peer_replaced): the held cluster cannot finish
// its run before the replacement rejoins it, however fast or slow the machine. Every other node,
// and every run without the variable, gets an empty function: nothing on the training path.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace cairn {

// The TrainerObserver::on_batch of the Root of cluster `cluster`: empty unless CAIRN_TEST_HOLD
// names that cluster. A malformed value is a BadInput naming the variable.
std::function<void(int64_t step, const std::vector<int64_t>& sample_ids)> testHoldFromEnvironment(
    int cluster, std::chrono::milliseconds limit);

}  // namespace cairn
