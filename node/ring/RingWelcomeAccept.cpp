// Taking a welcome into a ring (RingMembership.h acceptWelcome): does it fit the stage, does either
// copy of the parameters look corrupt next to the other, and entering its view and generation.
#include <algorithm>
#include <map>

#include "core/Error.h"
#include "core/Log.h"
#include "node/protocol/RingJoin.h"
#include "node/ring/RingMembership.h"
#include "node/ring/RingSyncMath.h"
#include "node/ring/RingTransaction.h"

namespace cairn {
namespace {

// Why `welcome` does not fit `ring` at this node (empty when it does): sender and view must be
// ring members, the view must hold this node and the sender, and every bucket's tensor must be
// present, 1-d, of the bucket's dtype and element count.
std::string misfit(const RingContext& context, const Ring& ring, const Welcome& welcome) {
  const std::set<std::string> members = membersOf(ring);
  if (!members.count(welcome.sender) || welcome.sender == context.node.name)
    return "sender is not a ring member";
  for (const auto& v : welcome.view)
    if (!members.count(v)) return "view names a non-member";
  const auto& view = welcome.view;
  if (std::find(view.begin(), view.end(), context.node.name) == view.end() ||
      std::find(view.begin(), view.end(), welcome.sender) == view.end())
    return "view must hold this node and the sender";
  std::map<std::string, torch::Tensor> named;
  for (const auto& t : welcome.tensors) named[t.name] = t.tensor;
  std::string problem;
  for (size_t i = 0; problem.empty() && i < ring.buckets.size(); ++i) {
    const auto& b = ring.buckets[i];
    auto check = [&](const std::string& key, bool required) {
      auto it = named.find(key);
      if (it == named.end()) {
        if (required) problem = "tensor " + key + " missing";
        return;
      }
      if (it->second.scalar_type() != b.dtype || it->second.dim() != 1 ||
          it->second.numel() != b.numel)
        problem = "tensor " + key + " should be 1-d " + dtypeName(b.dtype) + " of " +
                  std::to_string(b.numel) + " elements";
    };
    check("value." + std::to_string(i), b.numel > 0);
    if (b.previous.defined()) {
      check("previous." + std::to_string(i), true);
      check("momentum." + std::to_string(i), false);
    }
  }
  return problem;
}

// A welcome's parameters next to this node's own copy, by the contribution check's rule
// (RingSyncMath.h): why the welcome's look corrupt (`theirs`), or why this node's own do (`mine`);
// both empty when neither does. A sender alone in its ring has had nobody to compare its copy
// with, and neither has a joiner that trained alone (its cluster cut off from the ring): whoever
// is first to see the other's copy names a corrupt one. A joiner that took the welcome over its
// own corrupt copy would silently lose the only sign that its memory flips bits.
struct WelcomeCheck {
  std::string theirs, mine;
};
WelcomeCheck checkWelcomeCopy(const Ring& ring, const Welcome& welcome) {
  std::map<std::string, torch::Tensor> named;
  for (const auto& t : welcome.tensors) named[t.name] = t.tensor;
  const CopySummary theirs = summarizeCopy(
      ring, [&named](size_t i) { return named.at("value." + std::to_string(i)); });
  const CopySummary mine =
      summarizeCopy(ring, [&ring](size_t i) { return ring.flatten(ring.buckets[i], false); });
  // Both non-finite: a diverged training, not a corrupt copy; the first sync says so.
  if (mine.nonfinite && theirs.nonfinite) return {};
  if (mine.nonfinite) return {"", "holds a non-finite weight"};
  return {corruptNextTo(theirs, mine),
          corruptNextTo(mine, theirs, "the largest of the copy " + welcome.sender + "'s welcome carries")};
}

// Copies a welcome that fits into the stage and the ring's outer state (unless `take_tensors` is
// false: a corrupt-looking welcome, this node keeps its own), and enters its view and generation.
void applyWelcome(RingContext& context, Ring& ring, const Welcome& welcome, bool take_tensors) {
  // A view naming members a growth added (admitted while this node was away): they are members now.
  for (const auto& v : welcome.view) {
    const bool known = std::any_of(ring.spec.members.begin(), ring.spec.members.end(),
                                   [&v](const PeerRef& m) { return m.name == v; });
    if (!known && ring.expected_members.size() > ring.spec.members.size()) {
      ring.spec.members = ring.expected_members;
      CAIRN_INFO("ring ", ring.spec.id, ": the welcome's view holds the members a growth added; "
                 "they are ring members from now on");
      break;
    }
  }
  std::map<std::string, torch::Tensor> named;
  for (const auto& t : welcome.tensors) named[t.name] = t.tensor;
  for (size_t i = 0; take_tensors && i < ring.buckets.size(); ++i) {
    auto& b = ring.buckets[i];
    const std::string n = std::to_string(i);
    if (b.numel > 0) ring.unflatten(b, named.at("value." + n), false);
    if (b.previous.defined()) {
      b.previous = named.at("previous." + n).clone();
      auto mo = named.find("momentum." + n);
      b.momentum = mo == named.end() ? torch::Tensor() : mo->second.clone();
    }
  }
  const uint64_t sum = ring.checksum();
  if (take_tensors && sum != welcome.checksum)
    CAIRN_WARN("ring ", ring.spec.id, ": welcome from ", welcome.sender, " claims checksum ",
               welcome.checksum, " but its tensors hash to ", sum);
  std::vector<std::string> ordered;  // cluster order, whatever order the sender used
  for (const auto& member : ring.spec.members)
    if (std::find(welcome.view.begin(), welcome.view.end(), member.name) != welcome.view.end())
      ordered.push_back(member.name);
  regroup(context, ring, ordered, welcome.generation);
  ring.transactions = welcome.transactions;
  noteResult(context, ring);  // the sender's result (its welcome carries the state of a sync)
  if (!take_tensors) ring.result_sum.reset();  // not the sender's result: nothing to compare
  context.countStats([&](RingClusterSyncStats& s) {
    ++s.joined_rings;
    s.last_welcome_checksum = sum;
  });
  CAIRN_INFO("ring ", ring.spec.id, ": joined from ", welcome.sender, " at its step ", welcome.step,
             ", generation ", welcome.generation, ", view ", joinedNames(ordered),
             "; fetched weights checksum ", sum);
}

}  // namespace

bool acceptWelcome(RingContext& context, Ring& ring, const Message& m,
                   std::optional<int64_t> generation) {
  // A welcome from a non-member or one that does not fit this stage is dropped, not trusted.
  std::string problem;
  const auto welcome = decodeWelcome(m, &problem);
  if (welcome && generation && welcome->generation != *generation)
    problem = "it is into generation " + std::to_string(welcome->generation) + ", not " +
              std::to_string(*generation);
  else if (welcome)
    problem = misfit(context, ring, *welcome);
  std::string corrupt;
  if (problem.empty()) {
    const WelcomeCheck check = checkWelcomeCopy(ring, *welcome);
    // Corrupt in this process's memory: this node must not train on (the contribution check's
    // verdict). Loaded so from a checkpoint another process wrote (one whose memory flipped the
    // bit before anyone compared its copy): the welcome's sound copy replaces it.
    if (!check.mine.empty() && !context.copy_from_another_process)
      CAIRN_THROW(BadInput, "this node's copy of the ring's parameters ", check.mine,
                  ": corrupt (a flipped bit, bad memory?); it must not be averaged or trained on "
                  "(found next to the welcome into ring ", ring.spec.id, " from ", welcome->sender,
                  ")");
    if (!check.mine.empty())
      CAIRN_WARN("ring ", ring.spec.id, ": this node's copy of the ring's parameters, loaded from a "
                 "checkpoint another process wrote, ", check.mine, ": corrupt (that process's "
                 "memory flipped a bit?); taking the welcome's copy from ", welcome->sender);
    corrupt = check.theirs;
  }
  // Without a contribution check (gradients mode keeps copies equal by averaging gradients), a
  // corrupt-looking welcome cannot be taken as a member with its own weights: dropped.
  if (!corrupt.empty() && context.sync.mode == SyncMode::kGradients)
    problem = "its copy of the parameters " + corrupt + ": corrupt, not taken";
  if (!problem.empty()) {
    CAIRN_WARN("ring ", ring.spec.id, ": dropped a welcome from ", m.sender, ": ", problem);
    return false;
  }
  if (!corrupt.empty())
    CAIRN_WARN("ring ", ring.spec.id, ": the welcome from ", welcome->sender,
               " carries a copy of the parameters that ", corrupt, ": joined its view and generation but kept ",
               "this node's own weights; the next sync's contribution check decides which copy is ",
               "corrupt (RingSyncMath.h)");
  applyWelcome(context, ring, *welcome, corrupt.empty());
  return true;
}

}  // namespace cairn
