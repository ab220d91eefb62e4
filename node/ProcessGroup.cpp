#include "node/ProcessGroup.h"

#include <algorithm>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {
namespace {

using Clock = std::chrono::steady_clock;

// microbatch value of the message that tells the other members an operation failed; its text
// names the member that was lost.
constexpr uint64_t kAbortIndex = std::numeric_limits<uint64_t>::max();
// microbatch value of "still here, waiting for <text>", sent while a wait drags on.
constexpr uint64_t kKeepAliveIndex = kAbortIndex - 1;
// microbatch value of "I (the sender) leave this group", sent by sendLeave().
constexpr uint64_t kLeaveIndex = kAbortIndex - 2;
// Longest single wait inside an operation, so a transport's liveness report is acted on promptly.
constexpr std::chrono::milliseconds kLivenessPoll{100};
constexpr size_t kMaxGroupIdBytes = 200;  // the wire tag is ≤ 256 bytes
// Early messages of the current operation kept aside (gather and barrier receive from several
// members, whose messages may arrive in any order).
constexpr size_t kMaxStashedMessages = 1 << 16;
// How long a failing member spends telling each other member about it.
constexpr std::chrono::milliseconds kAbortSendTimeout{200};

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Part `i` of `parts` near-equal parts of [0, total): sizes differ by at most one element.
Range part(int64_t total, int64_t parts, int64_t i) {
  return {total * i / parts, total * (i + 1) / parts};
}

Range subrange(const Range& outer, int64_t parts, int64_t i) {
  const Range inner = part(outer.size(), parts, i);
  return {outer.begin + inner.begin, outer.begin + inner.end};
}

int modulo(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

torch::Tensor slice(const torch::Tensor& flat, const Range& r) {
  return flat.narrow(0, r.begin, r.size());
}

bool isReducedPrecision(torch::ScalarType t) {
  return t == torch::kFloat16 || t == torch::kBFloat16;
}

// The dtype partial reductions travel and accumulate in.
torch::ScalarType accumulationType(torch::ScalarType t) {
  return isReducedPrecision(t) ? torch::kFloat32 : t;
}

// acc ← acc ∘ in, elementwise, in place (acc and in have the same dtype and size).
void reduceInto(torch::Tensor& acc, const torch::Tensor& in, ReduceOp op) {
  const bool is_bool = acc.scalar_type() == torch::kBool;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      if (is_bool)
        torch::logical_or_out(acc, acc, in);
      else
        acc.add_(in);
      return;
    case ReduceOp::kMax:
      if (is_bool)
        torch::logical_or_out(acc, acc, in);
      else
        torch::maximum_out(acc, acc, in);
      return;
    case ReduceOp::kMin:
      if (is_bool)
        torch::logical_and_out(acc, acc, in);
      else
        torch::minimum_out(acc, acc, in);
      return;
  }
}

std::string millis(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAverage:
      return "average";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

// The state of one collective call on this node.
struct ProcessGroup::Operation {
  uint64_t sequence = 0;
  const char* name = "";
  // Messages of this operation that arrived before they were asked for, by (sender rank, index).
  std::map<std::pair<int, uint64_t>, Message> stash;
  // Views of the tensors handed to the transport, with their destination rank. Large ones are
  // sent without a copy: ZeroMQ holds a reference until the bytes have left (tcp) or the receiver
  // dropped them (inproc). The operation returns only once every one is released, so the caller
  // may reuse its tensor at once.
  std::vector<std::pair<int, torch::Tensor>> sent;
  std::string last_malformed;  // for the timeout message: what was wrong with a dropped chunk
};

ProcessGroup::ProcessGroup(Mailbox& mailbox, std::string group_id, std::vector<std::string> members,
                           const std::string& self, ProcessGroupOptions options)
    : mailbox_(mailbox),
      group_id_(std::move(group_id)),
      wire_tag_("coll:" + group_id_),
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
}

ProcessGroup::Operation ProcessGroup::begin(const char* name) {
  if (!broken_.empty()) CAIRN_THROW(PeerLost, broken_);
  Operation op;
  op.sequence = next_sequence_++;
  op.name = name;
  return op;
}

void ProcessGroup::finish(Operation& op) {
  waitForSendsToComplete(op);
  stats_.dropped_unexpected += op.stash.size();
  ++stats_.operations;
}

void ProcessGroup::checkTensor(const torch::Tensor& tensor, const char* what) const {
  if (!tensor.defined()) CAIRN_THROW(BadInput, "group ", group_id_, ": ", what, " is undefined");
  if (!tensor.device().is_cpu())
    CAIRN_THROW(BadInput, "group ", group_id_, ": ", what, " is not on the CPU");
  if (!wireDtypeCode(tensor.scalar_type()))
    CAIRN_THROW(BadInput, "group ", group_id_, ": ", what, " has dtype ",
                c10::toString(tensor.scalar_type()), ", which collectives do not carry");
}

void ProcessGroup::checkRoot(int root) const {
  if (root < 0 || root >= size())
    CAIRN_THROW(BadInput, "group ", group_id_, ": root rank ", root, " outside [0, ", size(), ")");
}

void ProcessGroup::sendChunk(Operation& op, int to_rank, uint64_t index, const torch::Tensor& data) {
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
    const SendStatus status = mailbox_.send(
        members_[to_rank], m,
        std::chrono::duration_cast<std::chrono::milliseconds>(slice_end - now));
    if (status == SendStatus::kSent) break;
    if (status == SendStatus::kUnknownPeer)
      CAIRN_THROW(InternalError, "group ", group_id_, ": member ", members_[to_rank],
                  " was never added as a peer of the transport");
    if (Clock::now() >= deadline)
      fail(op, to_rank, "took no message for " + millis(options_.timeout) + " (chunk " +
                            std::to_string(index) + " could not be sent)");
    if (disconnectedTooLong(to_rank))
      fail(op, to_rank, "is disconnected (transport) for over " + millis(options_.disconnected_grace) +
                            " (chunk " + std::to_string(index) + " could not be sent)");
    checkNotices(op, to_rank);
    sendKeepAlives(op, to_rank);
  }
  ++stats_.messages_sent;
  stats_.bytes_sent += view.nbytes();
  stats_.seconds_sending += std::chrono::duration<double>(Clock::now() - began).count();
  m.tensors.clear();
  op.sent.emplace_back(to_rank, std::move(view));
}

bool ProcessGroup::disconnectedTooLong(int rank) const {
  const PeerLiveness live = mailbox_.transport().liveness(members_[rank]);
  if (live.state != PeerState::kDisconnected) return false;
  return Clock::now() - live.since >= std::min(options_.disconnected_grace, options_.timeout);
}

void ProcessGroup::sendLeave(std::chrono::milliseconds timeout) {
  Message leave;
  leave.kind = MessageKind::kCollective;
  leave.sender = members_[rank_];
  leave.tag = wire_tag_;
  leave.step = next_sequence_;
  leave.microbatch = kLeaveIndex;
  leave.text = members_[rank_];
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    (void)mailbox_.send(members_[r], leave, timeout);  // best effort
  }
}

std::chrono::milliseconds ProcessGroup::keepAliveInterval() const {
  return std::max(std::chrono::milliseconds(10), options_.timeout / 4);
}

void ProcessGroup::sendKeepAlives(Operation& op, int waiting_on) {
  Message alive;
  alive.kind = MessageKind::kCollective;
  alive.sender = members_[rank_];
  alive.tag = wire_tag_;
  alive.step = op.sequence;
  alive.microbatch = kKeepAliveIndex;
  alive.text = members_[waiting_on];
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    (void)mailbox_.send(members_[r], alive, std::chrono::milliseconds(0));  // best effort
  }
}

bool ProcessGroup::acceptStashed(Operation& op, int from_rank, uint64_t index,
                                 torch::ScalarType dtype, int64_t numel, torch::Tensor* out) {
  auto it = op.stash.find({from_rank, index});
  if (it == op.stash.end()) return false;
  Message m = std::move(it->second);
  op.stash.erase(it);
  const auto& t = m.tensors;
  if (t.size() == 1 && t[0].tensor.dim() == 1 && t[0].tensor.scalar_type() == dtype &&
      t[0].tensor.numel() == numel) {
    *out = t[0].tensor;
    return true;
  }
  ++stats_.dropped_malformed;
  op.last_malformed = "chunk " + std::to_string(index) + " from " + members_[from_rank] +
                      " should hold one 1-d " + dtypeName(dtype) + " tensor of " +
                      std::to_string(numel) + " elements";
  if (t.size() == 1)
    op.last_malformed += ", got " + dtypeName(t[0].tensor.scalar_type()) + " with " +
                         std::to_string(t[0].tensor.numel()) + " elements";
  else
    op.last_malformed += ", got " + std::to_string(t.size()) + " tensors";
  CAIRN_WARN("group ", group_id_, " ", op.name, " #", op.sequence, ": dropped ", op.last_malformed);
  return false;
}

torch::Tensor ProcessGroup::receiveChunk(Operation& op, int from_rank, uint64_t index,
                                         torch::ScalarType dtype, int64_t numel) {
  const auto began = Clock::now();
  struct AddElapsed {
    double& total;
    Clock::time_point began;
    ~AddElapsed() { total += std::chrono::duration<double>(Clock::now() - began).count(); }
  } add_elapsed{stats_.seconds_receiving, began};
  torch::Tensor result;
  if (acceptStashed(op, from_rank, index, dtype, numel, &result)) {
    ++stats_.messages_received;
    return result;
  }
  const uint64_t sequence = op.sequence;
  const std::string& tag = wire_tag_;
  // Ours: this group's messages of this or an earlier operation, and aborts, keep-alives and
  // leaves of any operation. Later operations' chunks stay in the mailbox until we get there.
  auto ours = [&tag, sequence](const Message& m) {
    return m.kind == MessageKind::kCollective && m.tag == tag &&
           (m.step <= sequence || m.microbatch >= kLeaveIndex);
  };
  // `from_rank` must show life within `timeout` (a chunk, or a keep-alive saying it waits for
  // someone other than us) and deliver within twice that: a member that waits on a lost one
  // keeps its neighbours waiting until the abort naming the lost one arrives.
  const auto start = began;
  auto silent_deadline = start + options_.timeout;
  const auto hard_deadline = start + 2 * options_.timeout;
  auto next_keep_alive = start + keepAliveInterval();
  std::string peer_waits_on;
  for (;;) {
    auto now = Clock::now();
    if (now >= next_keep_alive) {
      sendKeepAlives(op, from_rank);
      next_keep_alive = now + keepAliveInterval();
    }
    if (disconnectedTooLong(from_rank))
      fail(op, from_rank, "is disconnected (transport) for over " +
                              millis(options_.disconnected_grace) + " (waiting for chunk " +
                              std::to_string(index) + ")");
    if (now >= silent_deadline || now >= hard_deadline) {
      std::string why = now >= silent_deadline
                            ? "sent nothing for " + millis(options_.timeout)
                            : "is alive (waiting for " + peer_waits_on + ") but sent no chunk for " +
                                  millis(2 * options_.timeout);
      why += " (waiting for chunk " + std::to_string(index) + ")";
      if (!op.last_malformed.empty()) why += "; last malformed chunk dropped: " + op.last_malformed;
      fail(op, from_rank, why);
    }
    const auto wake = std::min({silent_deadline, hard_deadline, next_keep_alive, now + kLivenessPoll});
    // A member that left sent everything it will ever send before its leave (one FIFO pipe): what
    // is not already here never comes.
    const bool gone = left_ranks_.count(from_rank) > 0;
    std::optional<Message> m = mailbox_.receive(
        ours, gone ? std::chrono::milliseconds(0)
                   : std::max(std::chrono::milliseconds(0),
                              std::chrono::duration_cast<std::chrono::milliseconds>(wake - now)));
    if (!m && gone) failLeft(op, from_rank);
    if (!m) continue;
    const auto sender = std::find(members_.begin(), members_.end(), m->sender);
    const int sender_rank = static_cast<int>(sender - members_.begin());
    if (sender == members_.end() || sender_rank == rank_) {
      ++stats_.dropped_malformed;
      CAIRN_WARN("group ", group_id_, ": dropped a collective message claiming to be from \"",
                 m->sender, "\"");
      continue;
    }
    if (m->microbatch == kLeaveIndex) {
      onLeaveNotice(op, *m, sender_rank, from_rank);
      continue;  // it may have sent all we need from it; we fail when we wait on it
    }
    if (m->microbatch == kAbortIndex) {
      failOnNotice(op, *m, sender_rank);
      continue;  // malformed: counted
    }
    if (m->microbatch == kKeepAliveIndex) {
      // Alive and waiting for someone else: the trouble is further along; keep waiting. Waiting
      // for us while we wait for it would be a cycle, which only the deadline ends.
      if (sender_rank == from_rank && m->text != members_[rank_]) {
        silent_deadline = Clock::now() + options_.timeout;
        peer_waits_on = m->text;
      }
      continue;
    }
    if (m->step < sequence) {
      ++stats_.dropped_stale;
      continue;
    }
    if (sender_rank == from_rank && m->microbatch == index) {
      op.stash.emplace(std::make_pair(from_rank, index), std::move(*m));
      if (acceptStashed(op, from_rank, index, dtype, numel, &result)) {
        ++stats_.messages_received;
        return result;
      }
      continue;
    }
    const auto key = std::make_pair(sender_rank, m->microbatch);
    if (op.stash.size() >= kMaxStashedMessages || op.stash.count(key)) {
      ++stats_.dropped_unexpected;
      continue;
    }
    op.stash.emplace(key, std::move(*m));
  }
}

void ProcessGroup::failLeft(Operation& op, int rank) {
  lost_peer_ = members_[rank];
  lost_by_leave_ = true;
  broken_ = "group " + group_id_ + " " + op.name + " #" + std::to_string(op.sequence) + ": peer " +
            members_[rank] + " (rank " + std::to_string(rank) + ") left the group";
  // Members waiting on us (not on the leaver) learn it from the leave, forwarded by us.
  sendAborts(op, rank, /*left=*/true);
  CAIRN_THROW(PeerLost, broken_);
}

void ProcessGroup::sendAborts(Operation& op, int lost_rank, bool left) {
  Message abort;
  abort.kind = MessageKind::kCollective;
  abort.sender = members_[rank_];
  abort.tag = wire_tag_;
  abort.step = op.sequence;
  abort.microbatch = left ? kLeaveIndex : kAbortIndex;  // a forwarded leave keeps the reason
  abort.text = members_[lost_rank];
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || r == lost_rank) continue;
    (void)mailbox_.send(members_[r], abort, kAbortSendTimeout);  // best effort
  }
}

// Leave notices: `txt` names the member that left. From that member itself, it is noted (and fails
// the operation only when we wait on it: `wait_rank`); forwarded by another member, that member's
// operation failed on it, so ours fails too.
void ProcessGroup::onLeaveNotice(Operation& op, const Message& m, int sender_rank, int wait_rank) {
  const auto leaver = std::find(members_.begin(), members_.end(), m.text);
  if (leaver == members_.end() || static_cast<int>(leaver - members_.begin()) == rank_) {
    ++stats_.dropped_malformed;
    return;
  }
  const int left_rank = static_cast<int>(leaver - members_.begin());
  left_ranks_.insert(left_rank);
  if (left_rank != sender_rank || left_rank == wait_rank) failLeft(op, left_rank);
}

void ProcessGroup::failOnNotice(Operation& op, const Message& m, int sender_rank) {
  const auto lost = std::find(members_.begin(), members_.end(), m.text);
  if (lost == members_.end()) {
    ++stats_.dropped_malformed;
    return;
  }
  lost_peer_ = m.text;
  broken_ = "group " + group_id_ + " " + op.name + " #" + std::to_string(op.sequence) + ": peer " +
            m.text + " (rank " + std::to_string(lost - members_.begin()) +
            ") was lost, reported by " + m.sender;
  CAIRN_THROW(PeerLost, broken_);
}

// While a send to `to_rank` waits for room: an abort of this group, or a leave of `to_rank`, in
// the mailbox ends it (other leaves are noted).
void ProcessGroup::checkNotices(Operation& op, int to_rank) {
  const std::string& tag = wire_tag_;
  const std::string& self = members_[rank_];
  auto notice = [&tag, &self](const Message& m) {
    return m.kind == MessageKind::kCollective && m.tag == tag && m.sender != self &&
           (m.microbatch == kAbortIndex || m.microbatch == kLeaveIndex);
  };
  while (auto m = mailbox_.receive(notice, std::chrono::milliseconds(0))) {
    const auto sender = std::find(members_.begin(), members_.end(), m->sender);
    if (sender == members_.end()) {
      ++stats_.dropped_malformed;
      continue;
    }
    const int sender_rank = static_cast<int>(sender - members_.begin());
    if (m->microbatch == kLeaveIndex) {
      onLeaveNotice(op, *m, sender_rank, to_rank);
      continue;
    }
    failOnNotice(op, *m, sender_rank);
  }
}

void ProcessGroup::fail(Operation& op, int lost_rank, const std::string& why) {
  lost_peer_ = members_[lost_rank];
  broken_ = "group " + group_id_ + " " + op.name + " #" + std::to_string(op.sequence) + ": peer " +
            members_[lost_rank] + " (rank " + std::to_string(lost_rank) + ") " + why;
  sendAborts(op, lost_rank, /*left=*/false);
  CAIRN_THROW(PeerLost, broken_);
}

void ProcessGroup::waitForSendsToComplete(Operation& op) {
  const auto began = Clock::now();
  const auto deadline = began + options_.timeout;
  auto next_keep_alive = Clock::now() + keepAliveInterval();
  for (auto& [to_rank, view] : op.sent) {
    while (view.use_count() > 1) {
      const auto now = Clock::now();
      if (now >= deadline)
        fail(op, to_rank, "did not take the last chunks sent to it within " +
                              millis(options_.timeout));
      if (now >= next_keep_alive) {
        sendKeepAlives(op, to_rank);
        next_keep_alive = now + keepAliveInterval();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  op.sent.clear();
  stats_.seconds_completing += std::chrono::duration<double>(Clock::now() - began).count();
}

// ---------------------------------------------------------------------------------------------
// all_reduce: ring reduce-scatter then ring all-gather over 2(n−1) steps. The tensor is cut into
// n blocks (one per rank, sizes differing by at most one element) and every block into m
// segments. At step s this node sends segment j of block (rank − s) to its right neighbour and
// receives segment j of block (rank − s − 1) from its left one: reduced into place for s < n−1,
// copied for s ≥ n−1. Messages are numbered t = s·m + j. Message t may be sent once message t−m
// has arrived (its data depends on it) and while at most max_in_flight messages are sent ahead
// of those received — the window that lets a ring of blocking sends never deadlock.
void ProcessGroup::ringAllReduce(Operation& op, torch::Tensor& flat, ReduceOp reduce_op) {
  const int n = size();
  const int64_t total_elements = flat.numel();
  const torch::ScalarType dtype = flat.scalar_type();
  const torch::ScalarType acc_type = accumulationType(dtype);
  // Reduced-precision dtypes reduce in a float32 copy: partial sums travel in float32 and the
  // final value is rounded once.
  torch::Tensor work = acc_type == dtype ? flat : flat.to(acc_type);

  const int64_t max_block = (total_elements + n - 1) / n;
  const int64_t segment_elements =
      std::max<int64_t>(1, static_cast<int64_t>(options_.segment_bytes / flat.element_size()));
  const int64_t m = std::max<int64_t>(1, (max_block + segment_elements - 1) / segment_elements);
  auto segment = [&](int block, int64_t j) { return subrange(part(total_elements, n, block), m, j); };

  const int right = modulo(rank_ + 1, n), left = modulo(rank_ - 1, n);
  const int64_t reduce_steps = n - 1;
  const uint64_t total = static_cast<uint64_t>(2 * reduce_steps * m);
  const uint64_t window = static_cast<uint64_t>(options_.max_in_flight);
  uint64_t sent = 0, received = 0;

  auto sendNext = [&] {
    const int64_t s = static_cast<int64_t>(sent / m), j = static_cast<int64_t>(sent % m);
    const Range r = segment(modulo(rank_ - s, n), j);
    sendChunk(op, right, sent, slice(s < reduce_steps ? work : flat, r));
    ++sent;
  };
  auto canSend = [&] {
    return sent < total && sent < received + window &&
           (sent < static_cast<uint64_t>(m) || sent - m < received);
  };
  while (received < total) {
    while (canSend()) sendNext();
    const int64_t s = static_cast<int64_t>(received / m), j = static_cast<int64_t>(received % m);
    const int block = modulo(rank_ - s - 1, n);
    const Range r = segment(block, j);
    if (s < reduce_steps) {
      torch::Tensor in = receiveChunk(op, left, received, acc_type, r.size());
      torch::Tensor acc = slice(work, r);
      reduceInto(acc, in, reduce_op);
      if (s == reduce_steps - 1) {  // this segment of block rank+1 now holds the full reduction
        if (reduce_op == ReduceOp::kAverage) acc.div_(n);
        if (acc_type != dtype) slice(flat, r).copy_(acc);
      }
    } else {
      torch::Tensor in = receiveChunk(op, left, received, dtype, r.size());
      slice(flat, r).copy_(in);
    }
    ++received;
  }
  while (sent < total) sendNext();
}

void ProcessGroup::allReduce(torch::Tensor& tensor, ReduceOp reduce_op) {
  checkTensor(tensor, "allReduce tensor");
  const bool floating = torch::isFloatingType(tensor.scalar_type());
  if (reduce_op == ReduceOp::kAverage && !floating)
    CAIRN_THROW(BadInput, "group ", group_id_, ": allReduce average needs a floating dtype, got ",
                dtypeName(tensor.scalar_type()), " (use sum and divide as you see fit)");
  torch::NoGradGuard no_grad;
  Operation op = begin("allReduce");
  if (size() > 1 && tensor.numel() > 0) {
    torch::Tensor flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
    ringAllReduce(op, flat, reduce_op);
    if (!tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
  }
  finish(op);
}

// broadcast: a pipelined chain root → root+1 → … → root−1; each member forwards a segment as
// soon as it has it.
void ProcessGroup::broadcast(torch::Tensor& tensor, int root) {
  checkTensor(tensor, "broadcast tensor");
  checkRoot(root);
  torch::NoGradGuard no_grad;
  Operation op = begin("broadcast");
  const int n = size();
  const int64_t total_elements = tensor.numel();
  if (n > 1 && total_elements > 0) {
    torch::Tensor flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
    const int64_t segment_elements =
        std::max<int64_t>(1, static_cast<int64_t>(options_.segment_bytes / flat.element_size()));
    const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
    const int position = modulo(rank_ - root, n);
    const int next = modulo(rank_ + 1, n), previous = modulo(rank_ - 1, n);
    for (int64_t j = 0; j < m; ++j) {
      const Range r = part(total_elements, m, j);
      if (position > 0)
        slice(flat, r).copy_(receiveChunk(op, previous, j, flat.scalar_type(), r.size()));
      if (position < n - 1) sendChunk(op, next, j, slice(flat, r));
    }
    if (!tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
  }
  finish(op);
}

// reduce: a pipelined chain root+1 → root+2 → … → root; each member adds its own segment to the
// partial it receives and passes it on. Partials of float16/bfloat16 travel in float32.
void ProcessGroup::reduce(torch::Tensor& tensor, int root, ReduceOp reduce_op) {
  checkTensor(tensor, "reduce tensor");
  checkRoot(root);
  if (reduce_op == ReduceOp::kAverage && !torch::isFloatingType(tensor.scalar_type()))
    CAIRN_THROW(BadInput, "group ", group_id_, ": reduce average needs a floating dtype, got ",
                dtypeName(tensor.scalar_type()));
  torch::NoGradGuard no_grad;
  Operation op = begin("reduce");
  const int n = size();
  const int64_t total_elements = tensor.numel();
  if (n > 1 && total_elements > 0) {
    torch::Tensor flat = tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
    const torch::ScalarType acc_type = accumulationType(flat.scalar_type());
    const int64_t segment_elements =
        std::max<int64_t>(1, static_cast<int64_t>(options_.segment_bytes / flat.element_size()));
    const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
    const int position = modulo(rank_ - root - 1, n);  // root is last
    const int next = modulo(rank_ + 1, n), previous = modulo(rank_ - 1, n);
    for (int64_t j = 0; j < m; ++j) {
      const Range r = part(total_elements, m, j);
      torch::Tensor own = slice(flat, r);
      if (position == 0) {
        sendChunk(op, next, j, own.scalar_type() == acc_type ? own : own.to(acc_type));
        continue;
      }
      // The received tensor may borrow the sender's memory (inproc): reduce into a copy.
      torch::Tensor partial =
          receiveChunk(op, previous, j, acc_type, r.size()).clone(at::MemoryFormat::Contiguous);
      reduceInto(partial, own.scalar_type() == acc_type ? own : own.to(acc_type), reduce_op);
      if (position < n - 1) {
        sendChunk(op, next, j, partial);
      } else {
        if (reduce_op == ReduceOp::kAverage) partial.div_(n);
        own.copy_(partial);
      }
    }
    if (rank_ == root && !tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
  }
  finish(op);
}

// all_gather: a ring of n−1 steps; at step s this node passes on block (rank − s) and receives
// block (rank − s − 1), each cut into segments and pipelined as in allReduce.
std::vector<torch::Tensor> ProcessGroup::allGather(const torch::Tensor& tensor) {
  checkTensor(tensor, "allGather tensor");
  torch::NoGradGuard no_grad;
  Operation op = begin("allGather");
  const int n = size();
  std::vector<torch::Tensor> outputs(n), flats(n);
  for (int i = 0; i < n; ++i) {
    outputs[i] = torch::empty(tensor.sizes(), tensor.options().memory_format(at::MemoryFormat::Contiguous));
    flats[i] = outputs[i].view({-1});
  }
  outputs[rank_].copy_(tensor);
  const int64_t total_elements = tensor.numel();
  if (n > 1 && total_elements > 0) {
    const int64_t segment_elements =
        std::max<int64_t>(1, static_cast<int64_t>(options_.segment_bytes / tensor.element_size()));
    const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
    const int right = modulo(rank_ + 1, n), left = modulo(rank_ - 1, n);
    const uint64_t total = static_cast<uint64_t>((n - 1) * m);
    const uint64_t window = static_cast<uint64_t>(options_.max_in_flight);
    uint64_t sent = 0, received = 0;
    auto sendNext = [&] {
      const int64_t s = static_cast<int64_t>(sent / m), j = static_cast<int64_t>(sent % m);
      sendChunk(op, right, sent, slice(flats[modulo(rank_ - s, n)], part(total_elements, m, j)));
      ++sent;
    };
    auto canSend = [&] {
      return sent < total && sent < received + window &&
             (sent < static_cast<uint64_t>(m) || sent - m < received);
    };
    while (received < total) {
      while (canSend()) sendNext();
      const int64_t s = static_cast<int64_t>(received / m), j = static_cast<int64_t>(received % m);
      const Range r = part(total_elements, m, j);
      slice(flats[modulo(rank_ - s - 1, n)], r)
          .copy_(receiveChunk(op, left, received, tensor.scalar_type(), r.size()));
      ++received;
    }
    while (sent < total) sendNext();
  }
  finish(op);
  return outputs;
}

// gather: every member sends its tensor, in segments, straight to the root.
std::vector<torch::Tensor> ProcessGroup::gather(const torch::Tensor& tensor, int root) {
  checkTensor(tensor, "gather tensor");
  checkRoot(root);
  torch::NoGradGuard no_grad;
  Operation op = begin("gather");
  const int n = size();
  const int64_t total_elements = tensor.numel();
  const int64_t segment_elements =
      std::max<int64_t>(1, static_cast<int64_t>(options_.segment_bytes / tensor.element_size()));
  const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
  std::vector<torch::Tensor> outputs;
  if (rank_ == root) {
    outputs.resize(n);
    for (int i = 0; i < n; ++i) {
      outputs[i] = torch::empty(tensor.sizes(), tensor.options().memory_format(at::MemoryFormat::Contiguous));
      if (i == rank_) {
        outputs[i].copy_(tensor);
        continue;
      }
      torch::Tensor flat = outputs[i].view({-1});
      for (int64_t j = 0; j < m; ++j) {
        const Range r = part(total_elements, m, j);
        slice(flat, r).copy_(receiveChunk(op, i, j, tensor.scalar_type(), r.size()));
      }
    }
  } else {
    torch::Tensor flat = tensor.contiguous().view({-1});
    for (int64_t j = 0; j < m; ++j) sendChunk(op, root, j, slice(flat, part(total_elements, m, j)));
  }
  finish(op);
  return outputs;
}

// scatter: the root sends each member its tensor, in segments.
void ProcessGroup::scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs, int root) {
  checkTensor(output, "scatter output");
  checkRoot(root);
  const int n = size();
  if (rank_ == root) {
    if (inputs.size() != static_cast<size_t>(n))
      CAIRN_THROW(BadInput, "group ", group_id_, ": scatter root needs ", n, " inputs, got ",
                  inputs.size());
    for (const auto& input : inputs) {
      checkTensor(input, "scatter input");
      if (input.sizes() != output.sizes() || input.scalar_type() != output.scalar_type())
        CAIRN_THROW(BadInput, "group ", group_id_, ": scatter inputs must match the output's shape ",
                    output.sizes(), " and dtype ", dtypeName(output.scalar_type()));
    }
  } else if (!inputs.empty()) {
    CAIRN_THROW(BadInput, "group ", group_id_, ": only the scatter root passes inputs");
  }
  torch::NoGradGuard no_grad;
  Operation op = begin("scatter");
  const int64_t total_elements = output.numel();
  const int64_t segment_elements =
      std::max<int64_t>(1, static_cast<int64_t>(options_.segment_bytes / output.element_size()));
  const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
  if (rank_ == root) {
    for (int i = 0; i < n; ++i) {
      if (i == rank_) continue;
      torch::Tensor flat = inputs[i].contiguous().view({-1});
      for (int64_t j = 0; j < m; ++j) sendChunk(op, i, j, slice(flat, part(total_elements, m, j)));
    }
    output.copy_(inputs[rank_]);
  } else {
    torch::Tensor flat = output.is_contiguous() ? output.view({-1}) : output.contiguous().view({-1});
    for (int64_t j = 0; j < m; ++j) {
      const Range r = part(total_elements, m, j);
      slice(flat, r).copy_(receiveChunk(op, root, j, output.scalar_type(), r.size()));
    }
    if (!output.is_contiguous()) output.copy_(flat.view(output.sizes()));
  }
  finish(op);
}

// barrier: dissemination — in round k (distance d = 2^k) send to rank + d, hear from rank − d.
// After ⌈log2 n⌉ rounds every member has heard, directly or not, from every other.
void ProcessGroup::barrier() {
  Operation op = begin("barrier");
  const int n = size();
  const torch::Tensor token = torch::empty({0}, torch::kUInt8);
  uint64_t round = 0;
  for (int distance = 1; distance < n; distance *= 2, ++round) {
    sendChunk(op, modulo(rank_ + distance, n), round, token);
    (void)receiveChunk(op, modulo(rank_ - distance, n), round, torch::kUInt8, 0);
  }
  finish(op);
}

}  // namespace cairn
