// VolunteerRelay: `provider --join INVITE --relay [--relay-mbps N] --listen HOST:PORT
// [--advertise HOST:PORT]`, a volunteer that only relays (docs/OPERATIONS.md "Behind a home
// router"): it trains nothing; it forwards the sealed messages of links between two dial-out-only
// volunteers that the coordinator routes through it (node/transport/Relay.h), which can neither
// read nor forge them.
//   1. binds its relay on --listen with its own key pair (identity.key), admitting only the
//      coordinator's key (the invite's) as the member "coordinator", with no link;
//   2. joins with `relay{mbps}` advertising that address: the coordinator attaches to check it
//      answers there (a relay must be reachable) and admits it as `relaying`;
//   3. heartbeats with its figures; each `relay_links` from the coordinator replaces what the relay
//      admits and forwards (the coordinator's key always stays);
//   4. ends at `finished` (exit 0) or a signal (`leaving`, exit 0).
// Thread-safety: the main thread; the relay has its own.
#pragma once

#include "node/volunteer/VolunteerSession.h"

namespace cairn {

// Returns the exit code (0); errors are thrown as cairn::Error (BadInput: 2).
int runRelayVolunteer(const VolunteerConfig& config);

}  // namespace cairn
