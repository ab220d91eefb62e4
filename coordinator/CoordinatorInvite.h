// CoordinatorInvite: who the coordinator is to its volunteers. Its key pair (OUT/coordinator.key,
// made on the first start and kept, so a restarted coordinator gives the same invite), the
// invite's token (--token, else the one stored in coordinator.db, else a fresh one; stored), and
// the invite formed from the address volunteers dial (written to --invite-file too).
// Ownership: none. Thread-safety: the coordinator's thread, before it serves.
#pragma once

#include <string>

#include "coordinator/CoordinatorStore.h"
#include "core/CurveKeys.h"

namespace cairn::coordinator {

// OUT/coordinator.key, made on the first start.
CurveKeyPair loadOrMakeCoordinatorKeys(const std::string& out);
// BadInput when `option` (--token) is given and is not 32 to 128 lowercase hex digits.
std::string chooseToken(CoordinatorStore& store, const std::string& option);
// The invite volunteers pass to provider --join: `advertise` (--advertise), else the `bound`
// address (BadInput when that is every interface, 0.0.0.0: `listen` names what was asked).
// Written atomically to `invite_file` when given.
std::string formInvite(const std::string& bound, const std::string& advertise,
                       const std::string& listen, const std::string& public_key,
                       const std::string& token, const std::string& invite_file);

}  // namespace cairn::coordinator
