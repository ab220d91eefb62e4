// A test hook, off unless the environment asks for it (issue [Q], silent corruption after the
// check): CAIRN_TEST_FLIP_AFTER_AVERAGE=NODE:TENSOR:INDEX:BIT makes node NODE flip bit BIT (0..31)
// of float element INDEX of its ring tensor TENSOR right after the reduction of its first average
// (or DiLoCo outer step, where θ_prev's element is flipped too) in this process (once), before the
// commit: its result then differs from every other member's, which only the result checksums can
// see (RingSyncMath.h checkContributions). Fires once per process for each value of the variable.
// tests/node/ClusterSyncFailuresTest.cpp uses it. A malformed value, or an element TENSOR does not
// have, is a BadInput naming the variable; a ring without TENSOR is left alone.
// Thread-safety: any ring thread.
#pragma once

#include <string>

#include "node/ring/RingState.h"

namespace cairn {

void testFlipAfterAverage(const std::string& node, Ring& ring);

}  // namespace cairn
