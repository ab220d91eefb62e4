#include "node/RingMembership.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/Log.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;

// Control messages of the ring membership protocol (docs/PROTOCOL.md "Ring membership").
std::string controlTag(const std::string& ring_id) { return "ring:" + ring_id; }
constexpr std::chrono::milliseconds kJoinRequestSendTimeout{200};

}  // namespace

// Joining: ask every other member of every shared ring to admit this node; wait (up to the ring
// timeout in all) for one welcome per ring and copy what it carries into the stage.
bool joinRings(RingContext& context, const std::vector<Ring*>& shared) {
  if (shared.empty()) return false;
  for (Ring* ring : shared) {
    Message request;
    request.kind = MessageKind::kCollective;
    request.sender = context.node.name;
    request.tag = controlTag(ring->spec.id);
    request.text = nlohmann::json{{"type", "join"}}.dump();
    for (const auto& m : ring->spec.members)
      if (m.name != context.node.name)
        (void)context.mailbox.send(m.name, request, kJoinRequestSendTimeout);
  }
  // A member that restarted quickly may still be in the live members' view: they need up to two
  // timeouts to drop it (ProcessGroup's keep-alive rule), then up to local_steps steps to reach a
  // sync boundary. Hence three timeouts, unless every other member is itself asking to join.
  const auto wait = 3 * context.timeout;
  CAIRN_INFO("cross-cluster sync: asked the ring peers to admit ", context.node.name, " (",
             shared.size(), " ring(s)); waiting up to ", wait.count(), " ms for a welcome");
  const auto deadline = Clock::now() + wait;
  size_t welcomed = 0;
  std::set<Ring*> done;
  auto everyoneJoining = [&] {
    for (Ring* ring : shared)
      for (const auto& m : ring->spec.members)
        if (m.name != context.node.name && !ring->join_requests.count(m.name)) return false;
    return true;
  };
  while (done.size() < shared.size()) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    if (welcomed == 0 && everyoneJoining()) {
      CAIRN_INFO("cross-cluster sync: every other ring member is joining too (all restarting)");
      break;
    }
    auto m = context.mailbox.receive(
        [&shared](const Message& x) {
          if (x.kind != MessageKind::kCollective) return false;
          for (Ring* ring : shared)
            if (x.tag == controlTag(ring->spec.id)) return true;
          return false;
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    if (!m) break;
    Ring* ring = nullptr;
    for (Ring* r : shared)
      if (m->tag == controlTag(r->spec.id)) ring = r;
    std::set<std::string> members;
    for (const auto& member : ring->spec.members) members.insert(member.name);
    if (m->text.find("\"join\"") != std::string::npos) {
      if (members.count(m->sender) && m->sender != context.node.name)
        ring->join_requests.insert(m->sender);
      continue;
    }
    if (done.count(ring)) continue;
    {
      // A welcome from a non-member or one that does not fit this stage is dropped, not trusted.
      std::string problem;
      nlohmann::json j = nlohmann::json::parse(m->text, nullptr, /*allow_exceptions=*/false);
      std::vector<std::string> view;
      int64_t generation = -1;
      std::map<std::string, torch::Tensor> named;
      if (!members.count(m->sender) || m->sender == context.node.name) {
        problem = "sender is not a ring member";
      } else if (!j.is_object() || !j.contains("type") || j["type"] != "welcome" ||
                 !j.contains("generation") || !j["generation"].is_number_integer() ||
                 !j.contains("view") || !j["view"].is_array()) {
        problem = "text must be a JSON welcome with integer \"generation\" and array \"view\"";
      } else {
        generation = j["generation"].get<int64_t>();
        for (const auto& v : j["view"]) {
          if (!v.is_string() || !members.count(v.get<std::string>())) {
            problem = "view names a non-member";
            break;
          }
          view.push_back(v.get<std::string>());
        }
        for (const char* key : {"step", "transactions", "checksum"})
          if (problem.empty() && (!j.contains(key) || !j[key].is_number_integer()))
            problem = std::string("\"") + key + "\" must be an integer";
        if (problem.empty() &&
            (generation < 1 ||
             std::find(view.begin(), view.end(), context.node.name) == view.end() ||
             std::find(view.begin(), view.end(), m->sender) == view.end()))
          problem = "view must hold this node and the sender, generation must be >= 1";
      }
      for (auto& t : m->tensors) named[t.name] = t.tensor;
      for (size_t i = 0; problem.empty() && i < ring->buckets.size(); ++i) {
        const auto& b = ring->buckets[i];
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
      if (!problem.empty()) {
        CAIRN_WARN("ring ", ring->spec.id, ": dropped a welcome from ", m->sender, ": ", problem);
        continue;
      }
      for (size_t i = 0; i < ring->buckets.size(); ++i) {
        auto& b = ring->buckets[i];
        const std::string n = std::to_string(i);
        if (b.numel > 0) ring->unflatten(b, named.at("value." + n), false);
        if (b.previous.defined()) {
          b.previous = named.at("previous." + n).clone();
          auto mo = named.find("momentum." + n);
          b.momentum = mo == named.end() ? torch::Tensor() : mo->second.clone();
        }
      }
      const uint64_t sum = ring->checksum();
      const uint64_t claimed = j["checksum"].get<uint64_t>();
      if (sum != claimed)
        CAIRN_WARN("ring ", ring->spec.id, ": welcome from ", m->sender, " claims checksum ",
                   claimed, " but its tensors hash to ", sum);
      std::vector<std::string> ordered;  // cluster order, whatever order the sender used
      for (const auto& member : ring->spec.members)
        if (std::find(view.begin(), view.end(), member.name) != view.end())
          ordered.push_back(member.name);
      regroup(context, *ring, ordered, generation);
      ring->transactions = j["transactions"].get<int64_t>();
      context.countStats([&](RingClusterSyncStats& s) {
        ++s.joined_rings;
        s.last_welcome_checksum = sum;
      });
      CAIRN_INFO("ring ", ring->spec.id, ": joined from ", m->sender, " at its step ",
                 j["step"].get<int64_t>(), ", generation ", generation, ", view ",
                 joinedNames(ordered), "; fetched weights checksum ", sum);
      done.insert(ring);
      ++welcomed;
    }
  }
  if (welcomed == 0) {
    CAIRN_WARN("cross-cluster sync: no ring peer admitted ", context.node.name,
               " (every cluster starting or resuming together?): ordinary start with the "
               "identical-weights check");
    return false;
  }
  for (Ring* ring : shared)
    if (!done.count(ring)) {
      CAIRN_WARN("ring ", ring->spec.id, ": no welcome within ", wait.count(),
                 " ms; this node trains without the ring (its syncs are no-ops)");
      regroup(context, *ring, {context.node.name}, 0);
    }
  return true;
}

// Drains this ring's join requests from the mailbox. Requests from members of the view are kept
// (a member that restarted before it was found lost): they count once it has been dropped.
void collectJoinRequests(RingContext& context, Ring& ring) {
  const std::string tag = controlTag(ring.spec.id);
  std::set<std::string> members;
  for (const auto& m : ring.spec.members) members.insert(m.name);
  auto match = [&tag](const Message& x) {
    return x.kind == MessageKind::kCollective && x.tag == tag &&
           x.text.find("\"join\"") != std::string::npos;
  };
  for (int i = 0; i < 1024; ++i) {
    auto m = context.mailbox.receive(match, std::chrono::milliseconds(0));
    if (!m) break;
    if (!members.count(m->sender) || m->sender == context.node.name) {
      CAIRN_WARN("ring ", ring.spec.id, ": ignored a join request from non-member \"", m->sender,
                 "\"");
      continue;
    }
    ring.join_requests.insert(m->sender);
  }
}

// After a committed sync: the lowest-ranked member of the view welcomes the joiners; every member
// moves to the next generation with them.
void admit(RingContext& context, Ring& ring, const std::vector<std::string>& joiners) {
  std::vector<std::string> next;
  for (const auto& m : ring.spec.members)
    if (std::find(ring.view.begin(), ring.view.end(), m.name) != ring.view.end() ||
        std::find(joiners.begin(), joiners.end(), m.name) != joiners.end())
      next.push_back(m.name);
  const int64_t generation = ring.generation + 1;
  if (ring.view.front() == context.node.name) {
    Message welcome;
    welcome.kind = MessageKind::kCollective;
    welcome.sender = context.node.name;
    welcome.tag = controlTag(ring.spec.id);
    const uint64_t sum = ring.checksum();
    welcome.text = nlohmann::json{
        {"type", "welcome"},
        {"generation", generation},
        {"view", next},
        {"step", context.last_synced_step},
        {"transactions", ring.transactions},
        {"checksum",
         sum}}.dump();
    for (size_t i = 0; i < ring.buckets.size(); ++i) {
      const auto& b = ring.buckets[i];
      const std::string n = std::to_string(i);
      if (b.numel > 0)
        welcome.tensors.push_back({"value." + n, ring.flatten(b, false).contiguous()});
      if (b.previous.defined()) welcome.tensors.push_back({"previous." + n, b.previous.clone()});
      if (b.momentum.defined()) welcome.tensors.push_back({"momentum." + n, b.momentum.clone()});
    }
    for (const auto& j : joiners) {
      const SendStatus status = context.mailbox.send(j, welcome, context.timeout);
      if (status != SendStatus::kSent)
        CAIRN_WARN("ring ", ring.spec.id, ": welcome to ", j, " not sent (", toString(status),
                   "); it will be found lost at the next sync");
    }
    context.countStats([&](RingClusterSyncStats& s) { s.last_welcome_checksum = sum; });
    CAIRN_INFO("ring ", ring.spec.id, ": admitted ", joinedNames(joiners), " at step ",
               context.last_synced_step, ", generation ", generation, ", view ", joinedNames(next),
               "; sent weights checksum ", sum);
  } else {
    CAIRN_INFO("ring ", ring.spec.id, ": ", joinedNames(joiners), " admitted by ",
               ring.view.front(), ", generation ", generation, ", view ", joinedNames(next));
  }
  for (const auto& j : joiners) ring.join_requests.erase(j);
  context.countStats([&](RingClusterSyncStats& s) { s.members_joined += int64_t(joiners.size()); });
  ring.alone_logged = false;
  regroup(context, ring, next, generation);
}

}  // namespace cairn
