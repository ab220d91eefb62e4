// VolunteerRun: `provider --join` from start to end (docs/OPERATIONS.md "Volunteers join"):
// probe this machine (RAM, cores, GFLOPS; the bandwidth is measured by the session), join the
// coordinator (VolunteerSession), wait for an assignment, train it with runProvider
// (node/pipeline/ProviderRun.h: binding --listen, peers dialling the advertised address) while heartbeats
// go on in the background, then upload the results (or, after a signal, say `leaving`).
// Returns the exit code: 0 when the run ended (results acknowledged or kept locally with a
// warning), stopped by a signal, or the coordinator said the run is finished; errors are thrown
// as cairn::Error (BadInput: 2, PeerLost: 3), after telling the coordinator the volunteer leaves.
// Thread-safety: call from the main thread (the one a signal wakes).
#pragma once

#include "node/volunteer/VolunteerSession.h"

namespace cairn {

int runVolunteer(const VolunteerConfig& config);
// This machine's RAM, cores, GFLOPS, GPUs and libtorch version for the join (the bandwidth is
// measured by the session), within the volunteer's limits (--cores, --memory-gb).
VolunteerProbe probeThisMachine(const VolunteerConfig& config);

}  // namespace cairn
