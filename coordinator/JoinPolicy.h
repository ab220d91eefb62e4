// JoinPolicy: whether a volunteer's join request may be accepted, before the reachability check.
// Pure checks of the request against the invite's token, the optional key allowlist, sane probe
// figures (the GPU figures' bounds, core/GpuFigures.h, are the decoder's: a join beyond them never
// gets here and is answered `rejected{"malformed message: join: probe: gpus[i]: …"}`), the
// volunteer's libtorch against the one that wrote the stage files it would be sent, and the
// addresses other members already advertise. Each refusal is one line the volunteer prints
// (`provider: error: the coordinator refused to join: <reason>`).
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "coordinator/CoordinatorStore.h"
#include "node/protocol/Coordination.h"

namespace cairn::coordinator {

struct JoinDecision {
  // kRejoining: a volunteer that said it leaves (its active hours ended, it was stopped), or was
  // lost (frozen or cut off past --lost-after-s) and is back, comes back without asking for its old
  // name: Admissions::admit gives it its node again when nobody took it over, else makes it a
  // spare.
  enum class Kind { kNew, kReturning, kRejoining, kRefused } kind = Kind::kRefused;
  std::string reason;            // kRefused: why
  std::optional<Member> member;  // kReturning, kRejoining: the member it was
};

// `key`: the sender's CURVE public key (ZAP User-Id); `members`: everyone the store knows;
// `stage_libtorch`: the libtorch version that wrote (or will write) the plan's stage files
// (Admissions: the plan's, else the coordinator's own). A volunteer whose libtorch major.minor is
// older is refused ("node_3's libtorch 1.13.0 cannot load stage files written by libtorch 2.11.0;
// install cairn built against libtorch ≥ 2.11"): newer libtorch loads older files (checked for
// 1.13 → 2.11), not the other way round.
JoinDecision decideJoin(const JoinAsk& ask, const std::string& key, const std::string& token,
                        const std::set<std::string>& allowed_keys, const std::vector<Member>& members,
                        const std::string& stage_libtorch);

// Constant-time comparison (the token is a secret).
bool sameSecret(const std::string& a, const std::string& b);

// `bytes` random bytes from the kernel's entropy source as hex (tokens, nonces).
std::string randomHex(size_t bytes);

}  // namespace cairn::coordinator
