#include "node/ring/RingState.h"

#include <random>
#include <sstream>
#include <utility>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {
namespace {

std::string groupIdOf(const std::string& ring_id, int64_t generation) {
  return generation == 0 ? ring_id : ring_id + "@" + std::to_string(generation);
}

// training_definition.wire.sync → the groups' chunk codec (the job parser allows no other value).
ChunkCodec chunkCodecOf(WireCodec wire) {
  switch (wire) {
    case WireCodec::kFp32:
      return ChunkCodec::kFp32;
    case WireCodec::kBf16:
      return ChunkCodec::kBf16;
    case WireCodec::kInt8:
      return ChunkCodec::kInt8;
    case WireCodec::kFp16:
      break;
  }
  CAIRN_THROW(BadInput, "training_definition.wire.sync \"", toString(wire),
              "\" is not a sync codec: use \"fp32\", \"bf16\" or \"int8\"");
}

}  // namespace

int64_t generationOfTag(const std::string& tag, const std::string& ring_id) {
  const std::string prefix = "coll:" + ring_id;
  if (tag.compare(0, prefix.size(), prefix) != 0) return -1;
  if (tag.size() == prefix.size()) return 0;
  if (tag[prefix.size()] != '@' || tag.size() == prefix.size() + 1) return -1;
  int64_t g = 0;
  for (size_t i = prefix.size() + 1; i < tag.size(); ++i) {
    if (tag[i] < '0' || tag[i] > '9' || g > (int64_t(1) << 40)) return -1;
    g = g * 10 + (tag[i] - '0');
  }
  return g;
}

std::string joinedNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return "[" + out + "]";
}

std::string Ring::describe() const {
  std::ostringstream out;
  out << spec.id << " (";
  for (size_t i = 0; i < spec.parameters.size(); ++i) {
    if (i == 3) {
      out << ", … " << spec.parameters.size() << " tensors";
      break;
    }
    out << (i ? ", " : "") << spec.parameters[i];
  }
  out << ")";
  return out.str();
}

void noteResult(const RingContext& context, Ring& ring) {
  if (context.sync.mode == SyncMode::kAverage) ring.result_sum = ring.resultChecksum(ring.spec.parameters);
}

// A new view/generation: a fresh ProcessGroup (or none when alone), and what is left in the
// mailbox of this ring's earlier generations thrown away (best effort: what arrives later is
// ignored by the new group's tag anyway and ages out of the bounded mailbox).
void regroup(RingContext& context, Ring& ring, std::vector<std::string> view, int64_t generation) {
  ring.view = std::move(view);
  ring.generation = generation;
  if (ring.group) {
    std::lock_guard<std::mutex> lock(context.stats_mutex);
    context.bytes_retired += ring.group->stats().bytes_sent;
  }
  ring.group.reset();
  if (ring.view.size() > 1) {
    ProcessGroupOptions options = context.group_options;
    options.codec = chunkCodecOf(context.sync.wire);  // the averages travel compressed or not
    options.replaced = [replaced = context.replaced, made = context.replaced->epoch()](const std::string& m) {
      return replaced->since(m, made);
    };
    ring.group = std::make_unique<ProcessGroup>(context.mailbox, groupIdOf(ring.spec.id, generation),
                                                ring.view, context.node.name, options);
  }
  if (generation == 0) return;
  const std::string id = ring.spec.id;
  auto stale = [&id, generation](const Message& m) {
    if (m.kind != MessageKind::kCollective) return false;
    const int64_t g = generationOfTag(m.tag, id);
    return g >= 0 && g < generation;
  };
  for (int i = 0; i < 4096 && context.mailbox.receive(stale, std::chrono::milliseconds(0)); ++i) {
  }
}

uint64_t RingContext::newLife() {
  std::random_device device;
  for (;;) {
    const uint64_t life = (uint64_t(device()) << 32) ^ uint64_t(device());
    if (life != 0) return life;
  }
}

void checkStop(const RingContext& context, std::optional<std::chrono::steady_clock::time_point>* seen,
               const std::string& what) {
  checkStopAsked(context.group_options, seen, "", what, "it leaves its rings");
}

void dropMember(RingContext& context, Ring& ring, const std::string& lost, bool left,
                const std::string& why) {
  std::vector<std::string> next;
  for (const auto& m : ring.view)
    if (m != lost) next.push_back(m);
  CAIRN_ENFORCE(next.size() < ring.view.size(), "ring ", ring.spec.id, ": lost member ", lost,
                " is not in the view ", joinedNames(ring.view));
  context.countStats([&](RingClusterSyncStats& s) { ++(left ? s.members_left : s.members_lost); });
  // A join request it sent before is of its earlier life: back, it asks again (every second).
  ring.join_requests.erase(lost);
  CAIRN_WARN("ring ", ring.spec.id, ": dropped ", lost, left ? " (it left)" : " (lost)", "; ", why,
             "; continuing with ", joinedNames(next), ", generation ", ring.generation + 1);
  regroup(context, ring, next, ring.generation + 1);
}

}  // namespace cairn
