// RingThreads: the thread fan-out of a node's rings (docs/THREADS.md "Concurrent rings"). Several
// rings (clusters cut differently: one node shares different tensors with different peers) run
// concurrently, one thread per ring (the calling thread takes the first), and the call returns
// when all have; torch's thread-local state (grad mode…) is carried into the ring threads. A ring
// for which no thread can be had runs on the calling thread after the others. With
// `concurrent` false (job.json "sync": {"concurrent_rings": false}) the rings run one after
// another in the given order (ring id order: the same total order on every node, so two nodes
// sharing several rings never wait in a cycle).
//
// Ownership: none; the threads live only inside the call. Thread-safety: `body` must be safe to
// run for different rings at once (each ring's state is its own; RingContext counts under a lock).
#pragma once

#include <functional>
#include <vector>

#include "node/ring/RingState.h"

namespace cairn {

// Runs body(ring) for each of `rings`; rethrows the first error in ring order once all ended.
void forEachRing(const std::vector<Ring*>& rings, bool concurrent,
                 const std::function<void(Ring&)>& body);

}  // namespace cairn
