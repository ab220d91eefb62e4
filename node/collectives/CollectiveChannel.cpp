#include "node/collectives/CollectiveChannel.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/Error.h"
#include "core/Log.h"
#include "node/protocol/CollectiveNotices.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;

// Longest single wait inside an operation, so a transport's liveness report is acted on promptly.
constexpr std::chrono::milliseconds kLivenessPoll{100};
constexpr size_t kMaxGroupIdBytes = 200;  // the wire tag is ≤ 256 bytes
// Early messages of the current operation kept aside (gather and barrier receive from several
// members, whose messages may arrive in any order).
constexpr size_t kMaxStashedMessages = 1 << 16;
// Messages kept aside for one (sender, index): the real one and a few forged or duplicated ones.
constexpr size_t kMaxStashedPerKey = 4;
// How long a failing member spends telling each other member about it.
constexpr std::chrono::milliseconds kAbortSendTimeout{200};

std::string millis(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

// CAIRN_COLLECTIVE_TRACE=1: every finished operation is logged (info) with its wall time, so a
// sync's phases can be told apart in a provider's log (docs/COLLECTIVES.md "Tracing").
bool tracing() {
  static const bool on = [] {
    const char* v = std::getenv("CAIRN_COLLECTIVE_TRACE");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}

// Adds the time from `began` to its destruction to `total` (a receive's seconds, however it ends).
struct AddElapsed {
  double& total;
  Clock::time_point began;
  ~AddElapsed() { total += std::chrono::duration<double>(Clock::now() - began).count(); }
};

}  // namespace

CollectiveChannel::CollectiveChannel(Mailbox& mailbox, std::string group_id,
                                     std::vector<std::string> members, const std::string& self,
                                     ProcessGroupOptions options)
    : mailbox_(mailbox),
      group_id_(std::move(group_id)),
      wire_tag_(collectiveTag(group_id_)),
      members_(std::move(members)),
      options_(options) {
  if (group_id_.empty() || group_id_.size() > kMaxGroupIdBytes)
    CAIRN_THROW(BadInput, "collective group id must have 1 to ", kMaxGroupIdBytes, " bytes, got \"",
                group_id_, "\"");
  if (members_.empty()) CAIRN_THROW(BadInput, "group ", group_id_, ": no members");
  auto sorted = members_;
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    CAIRN_THROW(BadInput, "group ", group_id_, ": member \"", *dup, "\" appears twice");
  auto me = std::find(members_.begin(), members_.end(), self);
  if (me == members_.end())
    CAIRN_THROW(BadInput, "group ", group_id_, ": \"", self, "\" is not a member");
  rank_ = static_cast<int>(me - members_.begin());
  if (options_.timeout.count() <= 0)
    CAIRN_THROW(BadInput, "group ", group_id_, ": timeout must be positive");
  if (options_.segment_bytes == 0)
    CAIRN_THROW(BadInput, "group ", group_id_, ": segment_bytes must be positive");
  if (options_.max_in_flight < 1)
    CAIRN_THROW(BadInput, "group ", group_id_, ": max_in_flight must be at least 1");
  if (const char* v = std::getenv("CAIRN_DIRECT_MAX_MEMBERS"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long members = std::strtol(v, &end, 10);
    if (*end != '\0' || members < 0 || members > 1 << 20)
      CAIRN_THROW(BadInput, "environment variable CAIRN_DIRECT_MAX_MEMBERS must be a count of "
                  "members (0 = always the ring), got \"", v, "\"");
    options_.direct_max_members = static_cast<int>(members);
  }
}

CollectiveChannel::Operation CollectiveChannel::begin(const char* name) {
  if (!broken_.empty()) CAIRN_THROW_LOST(loss_, broken_);
  Operation op;
  op.sequence = next_sequence_++;
  op.name = name;
  op.began = Clock::now();
  return op;
}

void CollectiveChannel::finish(Operation& op) {
  waitForSendsToComplete(op);
  stats_.dropped_unexpected += op.stash.size();
  ++stats_.operations;
  if (tracing()) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - op.began).count();
    CAIRN_INFO("collective trace: group ", group_id_, " ", op.name, " #", op.sequence, " ", ms,
               " ms (sent ", stats_.messages_sent, " msgs / ", stats_.bytes_sent, " B in total)");
  }
}

void CollectiveChannel::sendChunk(Operation& op, int to_rank, uint64_t index,
                                  const torch::Tensor& data) {
  Message m;
  m.kind = MessageKind::kCollective;
  m.sender = members_[rank_];
  m.tag = wire_tag_;
  m.step = op.sequence;
  m.microbatch = index;
  // A fresh view: its reference count tells when the transport has let go of the bytes.
  torch::Tensor view = data.view({-1});
  m.tensors.push_back({"", view});
  if (left_ranks_.count(to_rank)) failLeft(op, to_rank);  // it reads nothing any more
  // A ring never fills a live peer's queue (max_in_flight); a full one means the peer stopped
  // reading. Wait in slices, telling the others we are alive and whom we wait for.
  const auto began = Clock::now();
  const auto deadline = began + options_.timeout;
  for (;;) {
    const auto now = Clock::now();
    const auto slice_end = std::min({deadline, now + keepAliveInterval(), now + kLivenessPoll});
    const SendStatus status =
        mailbox_.send(members_[to_rank], m,
                      std::chrono::duration_cast<std::chrono::milliseconds>(slice_end - now));
    if (status == SendStatus::kSent) break;
    if (status == SendStatus::kUnknownPeer)
      CAIRN_THROW(InternalError, "group ", group_id_, ": member ", members_[to_rank],
                  " was never added as a peer of the transport");
    if (Clock::now() >= deadline)
      fail(op, to_rank, LossCause::kSilent,
           "took no message for " + millis(options_.timeout) + " (chunk " + std::to_string(index) +
               " could not be sent)");
    if (const std::string gone = goneReason(to_rank); !gone.empty())
      fail(op, to_rank, LossCause::kDisconnected,
           gone + " (chunk " + std::to_string(index) + " could not be sent)");
    checkNotices(op, to_rank);
    sendKeepAlives(op, to_rank);
    checkInterrupted(op, "for room to send a chunk");
  }
  ++stats_.messages_sent;
  stats_.bytes_sent += view.nbytes();
  stats_.seconds_sending += std::chrono::duration<double>(Clock::now() - began).count();
  m.tensors.clear();
  op.sent.emplace_back(to_rank, std::move(view));
}

void checkStopAsked(const ProcessGroupOptions& options, std::optional<Clock::time_point>* seen,
                    const std::string& prefix, const std::string& waiting_for,
                    const std::string& then) {
  if (!options.interrupted) return;
  if (!*seen) {
    if (!options.interrupted()) return;
    *seen = Clock::now();
  }
  if (Clock::now() - **seen < options.interrupt_after) return;
  CAIRN_THROW(Interrupted, prefix, "a stop was asked and, ", millis(options.interrupt_after),
              " later, this node still waits (", waiting_for, "); ", then);
}

void CollectiveChannel::checkInterrupted(const Operation& op, const char* waiting_for) {
  if (!options_.interrupted) return;  // no hook: the message below is not built every poll
  checkStopAsked(options_, &stop_seen_,
                 "group " + group_id_ + " " + op.name + " #" + std::to_string(op.sequence) + ": ",
                 waiting_for, "it leaves the group without finishing the operation");
}

std::string CollectiveChannel::goneReason(int rank) const {
  if (options_.replaced && options_.replaced(members_[rank]))
    return "was replaced (its node runs in another process now; that one rejoins through the "
           "ring's join protocol)";
  const PeerLiveness live = mailbox_.transport().liveness(members_[rank]);
  // From the group's creation at the earliest: a disconnection on record from before (a member's
  // previous life, before it was admitted again) must not drop it before it could connect.
  if (live.state == PeerState::kDisconnected &&
      Clock::now() - std::max(live.since, created_) >=
          std::min(options_.disconnected_grace, options_.timeout))
    return "is disconnected (transport) for over " + millis(options_.disconnected_grace);
  return "";
}

void CollectiveChannel::sendLeave(std::chrono::milliseconds timeout) {
  const Message leave =
      encode(LeaveNotice{members_[rank_], wire_tag_, next_sequence_, members_[rank_]});
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    (void)mailbox_.send(members_[r], leave, timeout);  // best effort
  }
}

std::chrono::milliseconds CollectiveChannel::keepAliveInterval() const {
  return std::max(std::chrono::milliseconds(10), options_.timeout / 4);
}

void CollectiveChannel::sendKeepAlives(Operation& op, int waiting_on) {
  const Message alive =
      encode(KeepAliveNotice{members_[rank_], wire_tag_, op.sequence, members_[waiting_on]});
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    (void)mailbox_.send(members_[r], alive, std::chrono::milliseconds(0));  // best effort
  }
}

bool CollectiveChannel::acceptStashed(Operation& op, int from_rank, uint64_t index,
                                      torch::ScalarType dtype, int64_t numel,
                                      const ChunkCheck& check, torch::Tensor* out) {
  // Several messages may claim this (sender, index) (a forged one next to the real one): the
  // first valid one is taken, the malformed ones before it are dropped.
  for (;;) {
    auto it = op.stash.find({from_rank, index});
    if (it == op.stash.end()) return false;
    Message m = std::move(it->second);
    op.stash.erase(it);
    if (acceptOne(op, m, from_rank, index, dtype, numel, check, out)) return true;
  }
}

bool CollectiveChannel::acceptOne(Operation& op, const Message& m, int from_rank, uint64_t index,
                                  torch::ScalarType dtype, int64_t numel, const ChunkCheck& check,
                                  torch::Tensor* out) {
  const auto& t = m.tensors;
  std::string bad_content;
  if (t.size() == 1 && t[0].tensor.dim() == 1 && t[0].tensor.scalar_type() == dtype &&
      t[0].tensor.numel() == numel) {
    if (check) bad_content = check(t[0].tensor);
    if (bad_content.empty()) {
      *out = t[0].tensor;
      return true;
    }
  }
  ++stats_.dropped_malformed;
  op.last_malformed = "chunk " + std::to_string(index) + " from " + members_[from_rank] +
                      " should hold one 1-d " + dtypeName(dtype) + " tensor of " +
                      std::to_string(numel) + " elements";
  if (!bad_content.empty())
    op.last_malformed += ", got one whose content is invalid: " + bad_content;
  else if (t.size() == 1)
    op.last_malformed += ", got " + dtypeName(t[0].tensor.scalar_type()) + " with " +
                         std::to_string(t[0].tensor.numel()) + " elements";
  else
    op.last_malformed += ", got " + std::to_string(t.size()) + " tensors";
  CAIRN_WARN("group ", group_id_, " ", op.name, " #", op.sequence, ": dropped ", op.last_malformed);
  return false;
}

torch::Tensor CollectiveChannel::receiveChunk(Operation& op, int from_rank, uint64_t index,
                                              torch::ScalarType dtype, int64_t numel,
                                              const ChunkCheck& check) {
  const auto began = Clock::now();
  AddElapsed add_elapsed{stats_.seconds_receiving, began};
  torch::Tensor result;
  if (acceptStashed(op, from_rank, index, dtype, numel, check, &result)) {
    ++stats_.messages_received;
    return result;
  }
  // `from_rank` must show life within `timeout` (a chunk, or a keep-alive saying it waits for
  // someone other than us) and deliver within twice that: a member that waits on a lost one
  // keeps its neighbours waiting until the abort naming the lost one arrives.
  ChunkWait wait{from_rank,
                 index,
                 dtype,
                 numel,
                 check,
                 /*silent_deadline=*/began + options_.timeout,
                 /*hard_deadline=*/began + 2 * options_.timeout,
                 /*next_keep_alive=*/began + keepAliveInterval(),
                 /*peer_waits_on=*/""};
  for (;;) {
    const auto now = Clock::now();
    checkWait(op, wait, now);
    std::optional<Message> m = nextMessage(op, wait, now);
    if (m && takeMessage(op, std::move(*m), wait, &result)) {
      ++stats_.messages_received;
      return result;
    }
  }
}

// Sends the keep-alives due, and fails the operation when the awaited member is gone (goneReason)
// or a deadline has passed.
void CollectiveChannel::checkWait(Operation& op, ChunkWait& wait, Clock::time_point now) {
  if (now >= wait.next_keep_alive) {
    sendKeepAlives(op, wait.from_rank);
    wait.next_keep_alive = now + keepAliveInterval();
  }
  if (const std::string gone = goneReason(wait.from_rank); !gone.empty())
    fail(op, wait.from_rank, LossCause::kDisconnected,
         gone + " (waiting for chunk " + std::to_string(wait.index) + ")");
  if (now >= wait.silent_deadline || now >= wait.hard_deadline) {
    std::string why = now >= wait.silent_deadline
                          ? "sent nothing for " + millis(options_.timeout)
                          : "is alive (waiting for " + wait.peer_waits_on +
                                ") but sent no chunk for " + millis(2 * options_.timeout);
    why += " (waiting for chunk " + std::to_string(wait.index) + ")";
    if (!op.last_malformed.empty()) why += "; last malformed chunk dropped: " + op.last_malformed;
    fail(op, wait.from_rank, LossCause::kSilent, why);
  }
  checkInterrupted(op, "for a chunk");
}

// The next message of ours from the mailbox, waiting at most until the next deadline, keep-alive
// or liveness poll; none when that passed first.
std::optional<Message> CollectiveChannel::nextMessage(Operation& op, const ChunkWait& wait,
                                                      Clock::time_point now) {
  const uint64_t sequence = op.sequence;
  const std::string& tag = wire_tag_;
  // Ours: this group's messages of this or an earlier operation, and aborts, keep-alives and
  // leaves of any operation. Later operations' chunks stay in the mailbox until we get there.
  auto ours = [&tag, sequence](const Message& m) {
    return m.kind == MessageKind::kCollective && m.tag == tag &&
           (m.step <= sequence || collectiveMessageType(m) != CollectiveMessageType::kChunk);
  };
  const auto wake = std::min(
      {wait.silent_deadline, wait.hard_deadline, wait.next_keep_alive, now + kLivenessPoll});
  // A member that left sent everything it will ever send before its leave (one FIFO pipe): what
  // is not already here never comes.
  const bool gone = left_ranks_.count(wait.from_rank) > 0;
  std::optional<Message> m = mailbox_.receive(
      ours, gone ? std::chrono::milliseconds(0)
                 : std::max(std::chrono::milliseconds(0),
                            std::chrono::duration_cast<std::chrono::milliseconds>(wake - now)));
  if (!m && gone) failLeft(op, wait.from_rank);
  return m;
}

// One message of ours while waiting: true when it is the awaited chunk and valid (`*out` set).
// Others are acted on (keep-alives, notices), kept aside for later (chunks asked for later in
// this operation), or dropped and counted.
bool CollectiveChannel::takeMessage(Operation& op, Message&& m, ChunkWait& wait,
                                    torch::Tensor* out) {
  const auto sender = std::find(members_.begin(), members_.end(), m.sender);
  const int sender_rank = static_cast<int>(sender - members_.begin());
  if (sender == members_.end() || sender_rank == rank_) {
    ++stats_.dropped_malformed;
    CAIRN_WARN("group ", group_id_, ": dropped a collective message claiming to be from \"",
               m.sender, "\"");
    return false;
  }
  const CollectiveMessageType type = collectiveMessageType(m);
  if (type == CollectiveMessageType::kKeepAlive) {
    onKeepAlive(m, sender_rank, wait);
    return false;
  }
  if (type != CollectiveMessageType::kChunk) {
    // A leave may come from a member that sent all we need from it: we fail when we wait on it.
    onNotice(op, m, sender_rank, wait.from_rank);
    return false;
  }
  if (m.step < op.sequence) {
    ++stats_.dropped_stale;
    return false;
  }
  if (sender_rank == wait.from_rank && m.microbatch == wait.index) {
    op.stash.emplace(std::make_pair(wait.from_rank, wait.index), std::move(m));
    return acceptStashed(op, wait.from_rank, wait.index, wait.dtype, wait.numel, wait.check, out);
  }
  const auto key = std::make_pair(sender_rank, m.microbatch);
  if (op.stash.size() >= kMaxStashedMessages || op.stash.count(key) >= kMaxStashedPerKey) {
    ++stats_.dropped_unexpected;
    return false;
  }
  op.stash.emplace(key, std::move(m));
  return false;
}

// Alive and waiting for someone else: the trouble is further along; keep waiting. Waiting for us
// while we wait for it would be a cycle, which only the deadline ends.
void CollectiveChannel::onKeepAlive(const Message& m, int sender_rank, ChunkWait& wait) {
  const auto alive = decodeKeepAlive(m, nullptr);
  if (!alive) {
    ++stats_.dropped_malformed;
  } else if (sender_rank == wait.from_rank && alive->waiting_for != members_[rank_]) {
    wait.silent_deadline = Clock::now() + options_.timeout;
    wait.peer_waits_on = alive->waiting_for;
  }
}

void CollectiveChannel::failLeft(Operation& op, int rank) {
  loss_ = PeerLoss{members_[rank], LossCause::kLeft, "", members_[rank]};
  broken_ = "group " + group_id_ + " " + op.name + " #" + std::to_string(op.sequence) + ": peer " +
            members_[rank] + " (rank " + std::to_string(rank) + ") left the group";
  // Members waiting on us (not on the leaver) learn it from the leave, forwarded by us.
  sendAborts(op, rank, /*left=*/true);
  CAIRN_THROW_LOST(loss_, broken_);
}

void CollectiveChannel::sendAborts(Operation& op, int lost_rank, bool left) {
  const std::string& self = members_[rank_];
  const std::string& lost = members_[lost_rank];
  // A forwarded leave keeps the reason.
  const Message abort = left ? encode(LeaveNotice{self, wire_tag_, op.sequence, lost})
                             : encode(AbortNotice{self, wire_tag_, op.sequence, lost});
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || r == lost_rank) continue;
    (void)mailbox_.send(members_[r], abort, kAbortSendTimeout);  // best effort
  }
}

// An abort or leave notice `m` from member `sender_rank` (malformed ones are counted and dropped).
// An abort fails the operation. A leave names the member that left: from that member itself, it
// is noted (and fails the operation only when we wait on it: `wait_rank`); forwarded by another
// member, that member's operation failed on it, so ours fails too.
// A notice stamped more than two operations past this one is left over from an earlier life of
// the same group id (a stage stopped and started again: its ring's generation back at 0) and
// dropped as stale: in this life no member gets that far ahead, since every operation needs every
// member's chunks (a broadcast's root could; a leave it sends that far ahead is then found by the
// silence timeout instead).
void CollectiveChannel::onNotice(Operation& op, const Message& m, int sender_rank, int wait_rank) {
  if (m.step > op.sequence + 2) {
    ++stats_.dropped_stale;
    CAIRN_WARN("group ", group_id_, " ", op.name, " #", op.sequence, ": dropped a notice from ",
               m.sender, " stamped #", m.step, " (left over from an earlier life of this group)");
    return;
  }
  std::string why;
  if (collectiveMessageType(m) == CollectiveMessageType::kAbort) {
    const auto abort = decodeAbort(m, &why);
    const auto lost =
        abort ? std::find(members_.begin(), members_.end(), abort->lost) : members_.end();
    if (lost == members_.end()) {
      ++stats_.dropped_malformed;
      return;
    }
    loss_ = PeerLoss{abort->lost, LossCause::kAborted, "", abort->lost};
    broken_ = "group " + group_id_ + " " + op.name + " #" + std::to_string(op.sequence) +
              ": peer " + abort->lost + " (rank " + std::to_string(lost - members_.begin()) +
              ") was lost, reported by " + abort->sender;
    CAIRN_THROW_LOST(loss_, broken_);
  }
  const auto leave = decodeLeave(m, &why);
  const auto leaver =
      leave ? std::find(members_.begin(), members_.end(), leave->leaver) : members_.end();
  if (leaver == members_.end() || static_cast<int>(leaver - members_.begin()) == rank_) {
    ++stats_.dropped_malformed;
    return;
  }
  const int left_rank = static_cast<int>(leaver - members_.begin());
  left_ranks_.insert(left_rank);
  if (left_rank != sender_rank || left_rank == wait_rank) failLeft(op, left_rank);
}

// While a send to `to_rank` waits for room: an abort of this group, or a leave of `to_rank`, in
// the mailbox ends it (other leaves are noted).
void CollectiveChannel::checkNotices(Operation& op, int to_rank) {
  const std::string& tag = wire_tag_;
  const std::string& self = members_[rank_];
  auto notice = [&tag, &self](const Message& m) {
    return m.kind == MessageKind::kCollective && m.tag == tag && m.sender != self &&
           (collectiveMessageType(m) == CollectiveMessageType::kAbort ||
            collectiveMessageType(m) == CollectiveMessageType::kLeave);
  };
  while (auto m = mailbox_.receive(notice, std::chrono::milliseconds(0))) {
    const auto sender = std::find(members_.begin(), members_.end(), m->sender);
    if (sender == members_.end()) {
      ++stats_.dropped_malformed;
      continue;
    }
    onNotice(op, *m, static_cast<int>(sender - members_.begin()), to_rank);
  }
}

void CollectiveChannel::fail(Operation& op, int lost_rank, LossCause cause,
                             const std::string& why) {
  loss_ = PeerLoss{members_[lost_rank], cause, "", members_[lost_rank]};
  broken_ = "group " + group_id_ + " " + op.name + " #" + std::to_string(op.sequence) + ": peer " +
            members_[lost_rank] + " (rank " + std::to_string(lost_rank) + ") " + why;
  sendAborts(op, lost_rank, /*left=*/false);
  CAIRN_THROW_LOST(loss_, broken_);
}

void CollectiveChannel::waitForSendsToComplete(Operation& op) {
  const auto began = Clock::now();
  const auto deadline = began + options_.timeout;
  auto next_keep_alive = Clock::now() + keepAliveInterval();
  for (auto& [to_rank, view] : op.sent) {
    while (view.use_count() > 1) {
      const auto now = Clock::now();
      if (now >= deadline)
        fail(op, to_rank, LossCause::kSilent,
             "did not take the last chunks sent to it within " + millis(options_.timeout));
      if (now >= next_keep_alive) {
        sendKeepAlives(op, to_rank);
        next_keep_alive = now + keepAliveInterval();
        checkInterrupted(op, "for the transport to take the last chunks");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  op.sent.clear();
  stats_.seconds_completing += std::chrono::duration<double>(Clock::now() - began).count();
}

}  // namespace cairn
