#include "node/protocol/CollectiveNotices.h"

namespace cairn {
namespace {

Message noticeMessage(const std::string& sender, const std::string& tag, uint64_t step,
                      uint64_t index, const std::string& member) {
  Message m;
  m.kind = MessageKind::kCollective;
  m.sender = sender;
  m.tag = tag;
  m.step = step;
  m.microbatch = index;
  m.text = member;
  return m;
}

// Checks the fields every notice shares; on success `*member` is its text.
bool validNotice(const Message& m, uint64_t index, const char* what, std::string* member,
                 std::string* why) {
  auto reject = [why, what](const std::string& reason) {
    if (why) *why = std::string(what) + ": " + reason;
    return false;
  };
  if (m.kind != MessageKind::kCollective) return reject("kind is not collective");
  if (m.tag.compare(0, 5, kCollectiveTagPrefix) != 0 || m.tag.size() == 5)
    return reject("tag \"" + m.tag + "\" is not coll:<group id>");
  if (m.microbatch != index) return reject("microbatch is not the reserved value");
  if (!m.tensors.empty()) return reject("carries tensors");
  if (m.text.empty()) return reject("text names no member");
  *member = m.text;
  return true;
}

}  // namespace

std::string collectiveTag(const std::string& group_id) { return kCollectiveTagPrefix + group_id; }

CollectiveMessageType collectiveMessageType(const Message& m) {
  switch (m.microbatch) {
    case kAbortIndex:
      return CollectiveMessageType::kAbort;
    case kKeepAliveIndex:
      return CollectiveMessageType::kKeepAlive;
    case kLeaveIndex:
      return CollectiveMessageType::kLeave;
    default:
      return CollectiveMessageType::kChunk;
  }
}

Message encode(const AbortNotice& n) {
  return noticeMessage(n.sender, n.tag, n.step, kAbortIndex, n.lost);
}
Message encode(const KeepAliveNotice& n) {
  return noticeMessage(n.sender, n.tag, n.step, kKeepAliveIndex, n.waiting_for);
}
Message encode(const LeaveNotice& n) {
  return noticeMessage(n.sender, n.tag, n.step, kLeaveIndex, n.leaver);
}

std::optional<AbortNotice> decodeAbort(const Message& m, std::string* why) {
  AbortNotice n{m.sender, m.tag, m.step, ""};
  if (!validNotice(m, kAbortIndex, "abort", &n.lost, why)) return std::nullopt;
  return n;
}

std::optional<KeepAliveNotice> decodeKeepAlive(const Message& m, std::string* why) {
  KeepAliveNotice n{m.sender, m.tag, m.step, ""};
  if (!validNotice(m, kKeepAliveIndex, "keep-alive", &n.waiting_for, why)) return std::nullopt;
  return n;
}

std::optional<LeaveNotice> decodeLeave(const Message& m, std::string* why) {
  LeaveNotice n{m.sender, m.tag, m.step, ""};
  if (!validNotice(m, kLeaveIndex, "leave", &n.leaver, why)) return std::nullopt;
  return n;
}

}  // namespace cairn
