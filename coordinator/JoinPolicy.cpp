#include "coordinator/JoinPolicy.h"

#include <random>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/GpuFigures.h"
#include "core/LibtorchVersion.h"
#include "core/NodeConfigs.h"

namespace cairn::coordinator {
namespace {

// Figures no real machine reports: a probe that claims them is broken or lying.
std::string probeProblem(const VolunteerProbe& p) {
  if (!(p.ram_gb > 0.05 && p.ram_gb <= 1e5))
    return "probe.ram_gb " + std::to_string(p.ram_gb) + " is not a machine's memory (0.05 to 100000 GB)";
  if (p.cores < 1 || p.cores > 100000)
    return "probe.cores " + std::to_string(p.cores) + " is not in 1..100000";
  if (!(p.compute_gflops > 0 && p.compute_gflops <= 1e7))
    return "probe.compute_gflops " + std::to_string(p.compute_gflops) + " is not in (0, 1e7]";
  if (!(p.bandwidth_mbps > 0 && p.bandwidth_mbps <= 1e7))
    return "probe.bandwidth_mbps " + std::to_string(p.bandwidth_mbps) + " is not in (0, 1e7]";
  try {  // the decoder checked these already; a JoinAsk made in-process has not been decoded
    (void)parseGpuFigures(gpuFiguresToJson(p.gpus), "probe.gpus");
  } catch (const Error& e) {
    return e.what();  // names the GPU, the key and the bound
  }
  return {};
}

bool active(MemberState s) {
  return s == MemberState::kJoining || s == MemberState::kSpare || s == MemberState::kAssigned ||
         s == MemberState::kRelaying;
}

}  // namespace

bool sameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.size() + 1)]);
  return diff == 0;
}

JoinDecision decideJoin(const JoinAsk& ask, const std::string& key, const std::string& token,
                        const std::set<std::string>& allowed_keys, const std::vector<Member>& members,
                        const std::string& stage_libtorch) {
  JoinDecision d;
  auto refuse = [&](std::string why) {
    d.kind = JoinDecision::Kind::kRefused;
    d.reason = std::move(why);
    return d;
  };
  if (!sameSecret(ask.token, token)) return refuse("wrong invite token");
  if (!isZ85Key(key)) return refuse("the connection has no CURVE key");
  if (!allowed_keys.empty() && !allowed_keys.count(key))
    return refuse("this volunteer's public key " + key + " is not on the coordinator's allowlist");
  if (const std::string problem = probeProblem(ask.probe); !problem.empty()) return refuse(problem);
  if (!parseLibtorchVersion(ask.probe.libtorch))
    return refuse("probe.libtorch \"" + ask.probe.libtorch.substr(0, kMaxLibtorchVersionBytes) +
                  "\" is not a libtorch version (major.minor.patch)");
  // A relay loads no stage file: its libtorch does not matter.
  if (const std::string problem = stageFilesProblem(ask.name.empty() ? "this volunteer" : ask.name,
                                                    ask.probe.libtorch, stage_libtorch);
      !problem.empty() && !ask.relay_mbps)
    return refuse(problem);
  if (ask.relay_mbps && ask.advertise.empty())
    return refuse("a relay must be reachable: both ends of its links dial it; provider --relay needs "
                  "--listen HOST:PORT (and --advertise HOST:PORT when that is not the address "
                  "volunteers dial)");
  std::string host;
  int port = 0;
  try {
    // No address at all: a dial-out-only volunteer (provider --join without --listen).
    if (!ask.advertise.empty()) parseHostPort(ask.advertise, "join", "advertise", &host, &port);
  } catch (const Error& e) {
    return refuse(e.what());
  }
  if (!ask.advertise.empty() && isWildcardHost(host))
    return refuse("advertise " + ask.advertise +
                  " is not an address peers can dial (give provider --advertise HOST:PORT)");

  const Member* by_key = nullptr;
  const Member* by_name = nullptr;
  for (const Member& m : members) {
    if (m.public_key == key) by_key = &m;
    if (!ask.name.empty() && m.name == ask.name) by_name = &m;
  }
  if (!ask.name.empty()) {
    if (!by_name) return refuse("no member is called " + ask.name + " in this run");
    if (by_name->public_key != key)
      return refuse(ask.name + " belongs to another key (was this volunteer replaced? join again "
                               "without its old workdir)");
  }
  const Member* known = by_name ? by_name : by_key;
  // A volunteer that said it leaves, or that was lost (frozen, cut off) and is back, may come back
  // as long as it does not ask for its old name (provider --join forgets it when it hands its node
  // over, or hears that its node was given to a spare): its node again if nobody took it, else a
  // spare (Admissions::rejoin).
  const bool rejoining = known && (known->state == MemberState::kLeft || known->state == MemberState::kLost) &&
                         ask.name.empty();
  if (known && active(known->state) && (known->state == MemberState::kRelaying) != ask.relay_mbps.has_value())
    return refuse(known->name + (known->state == MemberState::kRelaying
                                     ? " relays in this run: join again with --relay"
                                     : " is a training volunteer in this run (" + toString(known->state) +
                                           "): join again without --relay"));
  if (known && !active(known->state) && !rejoining)
    return refuse(known->name + " is " + toString(known->state) +
                  " in this run and cannot come back (it was replaced or left)");
  for (const Member& m : members)
    if (m.public_key != key && active(m.state) && !ask.advertise.empty() &&
        m.advertise == ask.advertise)
      return refuse("advertise " + ask.advertise + " is already taken by " + m.name +
                    " (two volunteers cannot share one address)");
  if (known) {
    d.kind = rejoining ? JoinDecision::Kind::kRejoining : JoinDecision::Kind::kReturning;
    d.member = *known;
    return d;
  }
  d.kind = JoinDecision::Kind::kNew;
  return d;
}

std::string randomHex(size_t bytes) {
  std::random_device device;  // the kernel's entropy source on Linux
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned v = device() & 0xff;
    out.push_back(digits[v >> 4]);
    out.push_back(digits[v & 15]);
  }
  return out;
}

}  // namespace cairn::coordinator
