#include "node/collectives/ProcessGroup.h"

#include <algorithm>
#include <utility>

#include "core/Error.h"
#include "core/WireCompression.h"

namespace cairn {
namespace {

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

// Direct groups all-reduce tensors up to this size by one whole exchange (wholeExchangeAllReduce):
// the rings' join flags (8 bytes per member, up to 8 members), recovery votes and BatchNorm
// counters, a few bytes each.
constexpr int64_t kWholeExchangeBytes = 64;

int modulo(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

torch::Tensor slice(const torch::Tensor& flat, const Range& r) {
  return flat.narrow(0, r.begin, r.size());
}

// The pipelined ring loop of allReduce and allGather (docs/COLLECTIVES.md "Pipelining"): `total`
// messages numbered t = s·m + j (ring step s, segment j). Message t may be sent once message t−m
// has arrived (its data depends on it) and while at most `window` messages are sent ahead of those
// received — the window that lets a ring of blocking sends never deadlock. The loop sends
// everything allowed, then receives the next message, so sends are queued while one is reduced.
template <typename Send, typename Receive>
void windowedRing(uint64_t total, uint64_t m, uint64_t window, Send send, Receive receive) {
  uint64_t sent = 0, received = 0;
  auto canSend = [&] {
    return sent < total && sent < received + window && (sent < m || sent - m < received);
  };
  while (received < total) {
    while (canSend()) send(sent++);
    receive(received++);
  }
  while (sent < total) send(sent++);
}

// How a float32 chunk of an all-reduce travels under a codec (wire.sync; ProcessGroup.h): its wire
// dtype and element count, its encoding, its decoding into float32, and the vetting of an int8
// chunk before use. kFp32: the tensor's own dtype, sent as it is. One piece for the ring and the
// direct all-reduce.
class ChunkWire {
 public:
  ChunkWire(ChunkCodec codec, torch::ScalarType dtype, const std::string& group)
      : compressed_(codec != ChunkCodec::kFp32), bf16_(codec == ChunkCodec::kBf16),
        dtype_(dtype), group_(group) {}
  torch::ScalarType type() const {
    return !compressed_ ? dtype_ : (bf16_ ? torch::kBFloat16 : torch::kUInt8);
  }
  int64_t numel(int64_t k) const {
    return compressed_ && !bf16_ ? wire::int8BlocksBytes(k, kInt8Block) : k;
  }
  torch::Tensor encode(const torch::Tensor& x) const {  // x: float32, 1-d
    if (!compressed_) return x;
    if (bf16_) return x.to(torch::kBFloat16);
    torch::Tensor c = x.contiguous();
    torch::Tensor out = torch::empty({numel(c.numel())}, torch::kUInt8);
    try {
      wire::encodeInt8Blocks(c.data_ptr<float>(), c.numel(), kInt8Block, out.data_ptr<uint8_t>());
    } catch (const std::invalid_argument& e) {
      CAIRN_THROW(BadInput, "group ", group_, ": wire.sync int8 cannot carry this tensor (",
                  e.what(), "); use \"bf16\" or \"fp32\"");
    }
    return out;
  }
  void decodeInto(const torch::Tensor& in, torch::Tensor out) const {  // out: contiguous slice
    if (!compressed_ || bf16_) {
      out.copy_(in);  // same dtype, or bfloat16 → float32 (exact)
      return;
    }
    wire::decodeInt8Blocks(in.data_ptr<uint8_t>(), out.numel(), kInt8Block, out.data_ptr<float>());
  }
  // int8: the scales and values are vetted before use (a bad chunk is dropped naming its sender).
  CollectiveChannel::ChunkCheck checkFor(int64_t k) const {
    if (!compressed_ || bf16_) return nullptr;
    return [k](const torch::Tensor& in) {
      return wire::checkInt8Blocks(in.data_ptr<uint8_t>(), k, kInt8Block);
    };
  }

 private:
  bool compressed_, bf16_;
  torch::ScalarType dtype_;
  const std::string& group_;
};

}  // namespace

ProcessGroup::ProcessGroup(Mailbox& mailbox, std::string group_id, std::vector<std::string> members,
                           const std::string& self, ProcessGroupOptions options)
    : channel_(mailbox, std::move(group_id), std::move(members), self, options) {}

void ProcessGroup::checkTensor(const torch::Tensor& tensor, const char* what) const {
  if (!tensor.defined()) CAIRN_THROW(BadInput, "group ", groupId(), ": ", what, " is undefined");
  if (!tensor.device().is_cpu())
    CAIRN_THROW(BadInput, "group ", groupId(), ": ", what, " is not on the CPU");
  if (!wireDtypeCode(tensor.scalar_type()))
    CAIRN_THROW(BadInput, "group ", groupId(), ": ", what, " has dtype ",
                c10::toString(tensor.scalar_type()), ", which collectives do not carry");
}

void ProcessGroup::checkRoot(int root) const {
  if (root < 0 || root >= size())
    CAIRN_THROW(BadInput, "group ", groupId(), ": root rank ", root, " outside [0, ", size(), ")");
}

int64_t ProcessGroup::segmentElements(int64_t element_size) const {
  return std::max<int64_t>(1,
                           static_cast<int64_t>(channel_.options().segment_bytes / element_size));
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
  const int64_t segment_elements = segmentElements(flat.element_size());
  const int64_t m = std::max<int64_t>(1, (max_block + segment_elements - 1) / segment_elements);
  auto segment = [&](int block, int64_t j) {
    return subrange(part(total_elements, n, block), m, j);
  };

  const int rank = this->rank();
  const int right = modulo(rank + 1, n), left = modulo(rank - 1, n);
  const int64_t reduce_steps = n - 1;
  windowedRing(
      static_cast<uint64_t>(2 * reduce_steps * m), static_cast<uint64_t>(m),
      static_cast<uint64_t>(channel_.options().max_in_flight),
      [&](uint64_t t) {
        const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
        const Range r = segment(modulo(rank - s, n), j);
        channel_.sendChunk(op, right, t, slice(s < reduce_steps ? work : flat, r));
      },
      [&](uint64_t t) {
        const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
        const Range r = segment(modulo(rank - s - 1, n), j);
        if (s < reduce_steps) {
          torch::Tensor in = channel_.receiveChunk(op, left, t, acc_type, r.size());
          torch::Tensor acc = slice(work, r);
          reduceInto(acc, in, reduce_op);
          if (s == reduce_steps - 1) {  // this segment of block rank+1 now holds the full reduction
            if (reduce_op == ReduceOp::kAverage) acc.div_(n);
            if (acc_type != dtype) slice(flat, r).copy_(acc);
          }
        } else {
          slice(flat, r).copy_(channel_.receiveChunk(op, left, t, dtype, r.size()));
        }
      });
}

// all_reduce with compressed chunks (float32 kSum/kAverage; the header): the same blocks,
// segments, message numbers and window as ringAllReduce, but every chunk travels encoded. A
// reduce-scatter hop sends its float32 partial (its own values at step 0) encoded; the receiver
// decodes it into float32 and adds it to its own. The member finishing a segment (averaging it
// if asked) encodes it once, writes the decoded values into its own tensor, and keeps the bytes;
// the all-gather forwards those bytes unchanged, every receiver decoding them: all members hold
// the same values.
void ProcessGroup::ringAllReduceCompressed(Operation& op, torch::Tensor& flat, ReduceOp reduce_op,
                                           ChunkCodec codec) {
  const int n = size();
  const int64_t total_elements = flat.numel();
  const int64_t max_block = (total_elements + n - 1) / n;
  const int64_t segment_elements = segmentElements(flat.element_size());
  const int64_t m = std::max<int64_t>(1, (max_block + segment_elements - 1) / segment_elements);
  auto segment = [&](int block, int64_t j) {
    return subrange(part(total_elements, n, block), m, j);
  };
  const ChunkWire wire(codec, torch::kFloat32, groupId());
  // The all-gather payload of segment j: what this member finished or last received.
  std::vector<torch::Tensor> gathered(static_cast<size_t>(m));

  const int rank = this->rank();
  const int right = modulo(rank + 1, n), left = modulo(rank - 1, n);
  const int64_t reduce_steps = n - 1;
  windowedRing(
      static_cast<uint64_t>(2 * reduce_steps * m), static_cast<uint64_t>(m),
      static_cast<uint64_t>(channel_.options().max_in_flight),
      [&](uint64_t t) {
        const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
        const Range r = segment(modulo(rank - s, n), j);
        channel_.sendChunk(op, right, t,
                           s < reduce_steps ? wire.encode(slice(flat, r)) : gathered[size_t(j)]);
      },
      [&](uint64_t t) {
        const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
        const Range r = segment(modulo(rank - s - 1, n), j);
        torch::Tensor in =
            channel_.receiveChunk(op, left, t, wire.type(), wire.numel(r.size()),
                                  wire.checkFor(r.size()));
        torch::Tensor own = slice(flat, r);
        if (s < reduce_steps) {
          torch::Tensor partial = torch::empty({r.size()}, torch::kFloat32);
          wire.decodeInto(in, partial);
          own.add_(partial);
          if (s == reduce_steps - 1) {  // this segment of block rank+1 now holds the full sum
            if (reduce_op == ReduceOp::kAverage) own.div_(n);
            gathered[size_t(j)] = wire.encode(own);
            wire.decodeInto(gathered[size_t(j)], own);
          }
        } else {
          wire.decodeInto(in, own);
          gathered[size_t(j)] = in;  // forwarded as received (read only)
        }
      });
}

bool ProcessGroup::direct() const {
  return size() > 1 && size() <= channel_.options().direct_max_members;
}

// all_reduce by direct exchanges (docs/COLLECTIVES.md "Direct exchanges"), for small groups and
// tensors whose blocks fit one segment: the blocks of ringAllReduce, but block b goes straight
// from every member to member b (message 0), which reduces the n contributions in rank order
// (float16/bfloat16 in float32, rounded once; averages divided by n) and sends the finished block
// straight to every other member (message 1). Each member sends and receives 2(n−1)/n of the
// tensor, as in the ring, but a result is 2 message delays away instead of 2(n−1). Every block is
// finished by one member and copied to the others: all members end bit-identical.
// Compressed codecs (float32 sum/average): each contribution travels encoded once and is decoded
// by member b, which adds them in float32 to its own exact values; the finished block is encoded
// once, adopted decoded by member b itself, and sent as those bytes.
void ProcessGroup::directAllReduce(Operation& op, torch::Tensor& flat, ReduceOp reduce_op,
                                   ChunkCodec codec) {
  const int n = size();
  const int rank = this->rank();
  const int64_t total = flat.numel();
  const torch::ScalarType dtype = flat.scalar_type();
  const torch::ScalarType acc_type = accumulationType(dtype);
  const bool compressed = codec != ChunkCodec::kFp32;
  const bool bf16 = codec == ChunkCodec::kBf16;
  const ChunkWire wire(codec, dtype, groupId());

  // Reduce-scatter: our part of every other member's block, straight to it (the right neighbour
  // first, so that the n members do not all send to the same one at once).
  for (int k = 1; k < n; ++k) {
    const int to = modulo(rank + k, n);
    channel_.sendChunk(op, to, 0, wire.encode(slice(flat, part(total, n, to))));
  }
  const Range mine = part(total, n, rank);
  torch::Tensor own = slice(flat, mine);
  torch::Tensor acc;  // acc_type, the sum of the contributions so far, in rank order
  for (int from = 0; from < n; ++from) {
    torch::Tensor contribution;
    if (from == rank) {
      contribution = own;
    } else {
      torch::Tensor in = channel_.receiveChunk(op, from, 0, wire.type(), wire.numel(mine.size()),
                                               wire.checkFor(mine.size()));
      if (compressed && !bf16) {
        contribution = torch::empty({mine.size()}, torch::kFloat32);
        wire.decodeInto(in, contribution);
      } else {
        contribution = in;  // may borrow the sender's memory: only read
      }
    }
    if (!acc.defined()) {
      acc = contribution.to(acc_type, /*non_blocking=*/false, /*copy=*/true);
    } else if (contribution.scalar_type() == acc_type) {
      reduceInto(acc, contribution, reduce_op);
    } else {
      reduceInto(acc, contribution.to(acc_type), reduce_op);
    }
  }
  if (reduce_op == ReduceOp::kAverage) acc.div_(n);
  // The finished block: adopted here, then sent to every other member as these bytes.
  torch::Tensor finished;
  if (compressed) {
    finished = wire.encode(acc);
    wire.decodeInto(finished, own);
  } else {
    own.copy_(acc);
    finished = own;
  }
  for (int k = 1; k < n; ++k) channel_.sendChunk(op, modulo(rank + k, n), 1, finished);
  // All-gather: every other member's finished block (the left neighbour first: it is the first
  // whose reduce-scatter chunk from us left).
  for (int k = 1; k < n; ++k) {
    const int from = modulo(rank - k, n);
    const Range r = part(total, n, from);
    torch::Tensor in =
        channel_.receiveChunk(op, from, 1, wire.type(), wire.numel(r.size()),
                              wire.checkFor(r.size()));
    wire.decodeInto(in, slice(flat, r));
  }
}

// all_reduce of a tiny tensor (direct groups, at most kWholeExchangeBytes = 64, uncompressed): one
// message delay. Every member sends its whole tensor to every other (message 0) and reduces the n
// tensors itself, in rank order (float16/bfloat16 in float32, rounded once; averages divided by
// n): the same inputs and the same operations on every member, so bit-identical results.
void ProcessGroup::wholeExchangeAllReduce(Operation& op, torch::Tensor& flat, ReduceOp reduce_op) {
  const int n = size();
  const int rank = this->rank();
  const torch::ScalarType dtype = flat.scalar_type();
  const torch::ScalarType acc_type = accumulationType(dtype);
  torch::Tensor mine = flat.clone();  // the sent bytes stay ours while flat is overwritten
  for (int k = 1; k < n; ++k) channel_.sendChunk(op, modulo(rank + k, n), 0, mine);
  torch::Tensor acc;
  for (int from = 0; from < n; ++from) {
    torch::Tensor c =
        from == rank ? mine : channel_.receiveChunk(op, from, 0, dtype, flat.numel());
    if (!acc.defined())
      acc = c.to(acc_type, /*non_blocking=*/false, /*copy=*/true);
    else if (c.scalar_type() == acc_type)
      reduceInto(acc, c, reduce_op);
    else
      reduceInto(acc, c.to(acc_type), reduce_op);
  }
  if (reduce_op == ReduceOp::kAverage) acc.div_(n);
  flat.copy_(acc);
}

void ProcessGroup::allReduce(torch::Tensor& tensor, ReduceOp reduce_op) {
  checkTensor(tensor, "allReduce tensor");
  const bool floating = torch::isFloatingType(tensor.scalar_type());
  if (reduce_op == ReduceOp::kAverage && !floating)
    CAIRN_THROW(BadInput, "group ", groupId(), ": allReduce average needs a floating dtype, got ",
                dtypeName(tensor.scalar_type()), " (use sum and divide as you see fit)");
  torch::NoGradGuard no_grad;
  Operation op = channel_.begin("allReduce");
  if (size() > 1 && tensor.numel() > 0) {
    torch::Tensor flat =
        tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
    const ChunkCodec codec = channel_.options().codec;
    const bool compressed = codec != ChunkCodec::kFp32 && flat.scalar_type() == torch::kFloat32 &&
                            (reduce_op == ReduceOp::kSum || reduce_op == ReduceOp::kAverage);
    const int64_t max_block = (flat.numel() + size() - 1) / size();
    if (direct() && !compressed &&
        flat.numel() * int64_t(flat.element_size()) <= kWholeExchangeBytes)
      wholeExchangeAllReduce(op, flat, reduce_op);
    else if (direct() && max_block <= segmentElements(flat.element_size()))
      directAllReduce(op, flat, reduce_op, compressed ? codec : ChunkCodec::kFp32);
    else if (compressed)
      ringAllReduceCompressed(op, flat, reduce_op, codec);
    else
      ringAllReduce(op, flat, reduce_op);
    if (!tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
  }
  channel_.finish(op);
}

// broadcast: a pipelined chain root → root+1 → … → root−1; each member forwards a segment as
// soon as it has it.
void ProcessGroup::broadcast(torch::Tensor& tensor, int root) {
  checkTensor(tensor, "broadcast tensor");
  checkRoot(root);
  torch::NoGradGuard no_grad;
  Operation op = channel_.begin("broadcast");
  const int n = size();
  const int64_t total_elements = tensor.numel();
  if (n > 1 && total_elements > 0) {
    torch::Tensor flat =
        tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
    const int64_t segment_elements = segmentElements(flat.element_size());
    const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
    const int position = modulo(rank() - root, n);
    const int next = modulo(rank() + 1, n), previous = modulo(rank() - 1, n);
    for (int64_t j = 0; j < m; ++j) {
      const Range r = part(total_elements, m, j);
      if (position > 0)
        slice(flat, r).copy_(channel_.receiveChunk(op, previous, j, flat.scalar_type(), r.size()));
      if (position < n - 1) channel_.sendChunk(op, next, j, slice(flat, r));
    }
    if (!tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
  }
  channel_.finish(op);
}

// reduce: a pipelined chain root+1 → root+2 → … → root; each member adds its own segment to the
// partial it receives and passes it on. Partials of float16/bfloat16 travel in float32.
void ProcessGroup::reduce(torch::Tensor& tensor, int root, ReduceOp reduce_op) {
  checkTensor(tensor, "reduce tensor");
  checkRoot(root);
  if (reduce_op == ReduceOp::kAverage && !torch::isFloatingType(tensor.scalar_type()))
    CAIRN_THROW(BadInput, "group ", groupId(), ": reduce average needs a floating dtype, got ",
                dtypeName(tensor.scalar_type()));
  torch::NoGradGuard no_grad;
  Operation op = channel_.begin("reduce");
  const int n = size();
  const int64_t total_elements = tensor.numel();
  if (n > 1 && total_elements > 0) {
    torch::Tensor flat =
        tensor.is_contiguous() ? tensor.view({-1}) : tensor.contiguous().view({-1});
    const torch::ScalarType acc_type = accumulationType(flat.scalar_type());
    const int64_t segment_elements = segmentElements(flat.element_size());
    const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
    const int position = modulo(rank() - root - 1, n);  // root is last
    const int next = modulo(rank() + 1, n), previous = modulo(rank() - 1, n);
    for (int64_t j = 0; j < m; ++j) {
      const Range r = part(total_elements, m, j);
      torch::Tensor own = slice(flat, r);
      if (position == 0) {
        channel_.sendChunk(op, next, j, own.scalar_type() == acc_type ? own : own.to(acc_type));
        continue;
      }
      // The received tensor may borrow the sender's memory (inproc): reduce into a copy.
      torch::Tensor partial = channel_.receiveChunk(op, previous, j, acc_type, r.size())
                                  .clone(at::MemoryFormat::Contiguous);
      reduceInto(partial, own.scalar_type() == acc_type ? own : own.to(acc_type), reduce_op);
      if (position < n - 1) {
        channel_.sendChunk(op, next, j, partial);
      } else {
        if (reduce_op == ReduceOp::kAverage) partial.div_(n);
        own.copy_(partial);
      }
    }
    if (rank() == root && !tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
  }
  channel_.finish(op);
}

// all_gather: a ring of n−1 steps; at step s this node passes on block (rank − s) and receives
// block (rank − s − 1), each cut into segments and pipelined as in allReduce.
std::vector<torch::Tensor> ProcessGroup::allGather(const torch::Tensor& tensor) {
  checkTensor(tensor, "allGather tensor");
  torch::NoGradGuard no_grad;
  Operation op = channel_.begin("allGather");
  const int n = size();
  std::vector<torch::Tensor> outputs(n), flats(n);
  for (int i = 0; i < n; ++i) {
    outputs[i] =
        torch::empty(tensor.sizes(), tensor.options().memory_format(at::MemoryFormat::Contiguous));
    flats[i] = outputs[i].view({-1});
  }
  outputs[rank()].copy_(tensor);
  const int64_t total_elements = tensor.numel();
  if (n > 1 && total_elements > 0) {
    const int64_t segment_elements = segmentElements(tensor.element_size());
    const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
    const int rank = this->rank();
    const int right = modulo(rank + 1, n), left = modulo(rank - 1, n);
    windowedRing(
        static_cast<uint64_t>((n - 1) * m), static_cast<uint64_t>(m),
        static_cast<uint64_t>(channel_.options().max_in_flight),
        [&](uint64_t t) {
          const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
          channel_.sendChunk(op, right, t,
                             slice(flats[modulo(rank - s, n)], part(total_elements, m, j)));
        },
        [&](uint64_t t) {
          const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
          const Range r = part(total_elements, m, j);
          slice(flats[modulo(rank - s - 1, n)], r)
              .copy_(channel_.receiveChunk(op, left, t, tensor.scalar_type(), r.size()));
        });
  }
  channel_.finish(op);
  return outputs;
}

// gather: every member sends its tensor, in segments, straight to the root.
std::vector<torch::Tensor> ProcessGroup::gather(const torch::Tensor& tensor, int root) {
  checkTensor(tensor, "gather tensor");
  checkRoot(root);
  torch::NoGradGuard no_grad;
  Operation op = channel_.begin("gather");
  const int n = size();
  const int64_t total_elements = tensor.numel();
  const int64_t segment_elements = segmentElements(tensor.element_size());
  const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
  std::vector<torch::Tensor> outputs;
  if (rank() == root) {
    outputs.resize(n);
    for (int i = 0; i < n; ++i) {
      outputs[i] = torch::empty(tensor.sizes(),
                                tensor.options().memory_format(at::MemoryFormat::Contiguous));
      if (i == rank()) {
        outputs[i].copy_(tensor);
        continue;
      }
      torch::Tensor flat = outputs[i].view({-1});
      for (int64_t j = 0; j < m; ++j) {
        const Range r = part(total_elements, m, j);
        slice(flat, r).copy_(channel_.receiveChunk(op, i, j, tensor.scalar_type(), r.size()));
      }
    }
  } else {
    torch::Tensor flat = tensor.contiguous().view({-1});
    for (int64_t j = 0; j < m; ++j)
      channel_.sendChunk(op, root, j, slice(flat, part(total_elements, m, j)));
  }
  channel_.finish(op);
  return outputs;
}

// scatter: the root sends each member its tensor, in segments.
void ProcessGroup::scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                           int root) {
  checkTensor(output, "scatter output");
  checkRoot(root);
  const int n = size();
  if (rank() == root) {
    if (inputs.size() != static_cast<size_t>(n))
      CAIRN_THROW(BadInput, "group ", groupId(), ": scatter root needs ", n, " inputs, got ",
                  inputs.size());
    for (const auto& input : inputs) {
      checkTensor(input, "scatter input");
      if (input.sizes() != output.sizes() || input.scalar_type() != output.scalar_type())
        CAIRN_THROW(BadInput, "group ", groupId(),
                    ": scatter inputs must match the output's shape ", output.sizes(),
                    " and dtype ", dtypeName(output.scalar_type()));
    }
  } else if (!inputs.empty()) {
    CAIRN_THROW(BadInput, "group ", groupId(), ": only the scatter root passes inputs");
  }
  torch::NoGradGuard no_grad;
  Operation op = channel_.begin("scatter");
  const int64_t total_elements = output.numel();
  const int64_t segment_elements = segmentElements(output.element_size());
  const int64_t m = (total_elements + segment_elements - 1) / segment_elements;
  if (rank() == root) {
    for (int i = 0; i < n; ++i) {
      if (i == rank()) continue;
      torch::Tensor flat = inputs[i].contiguous().view({-1});
      for (int64_t j = 0; j < m; ++j)
        channel_.sendChunk(op, i, j, slice(flat, part(total_elements, m, j)));
    }
    output.copy_(inputs[rank()]);
  } else {
    torch::Tensor flat =
        output.is_contiguous() ? output.view({-1}) : output.contiguous().view({-1});
    for (int64_t j = 0; j < m; ++j) {
      const Range r = part(total_elements, m, j);
      slice(flat, r).copy_(channel_.receiveChunk(op, root, j, output.scalar_type(), r.size()));
    }
    if (!output.is_contiguous()) output.copy_(flat.view(output.sizes()));
  }
  channel_.finish(op);
}

// barrier: small groups (direct()) in one round; larger ones by dissemination — in round k (distance d = 2^k) send to rank + d, hear from rank − d.
// After ⌈log2 n⌉ rounds every member has heard, directly or not, from every other.
void ProcessGroup::barrier() {
  Operation op = channel_.begin("barrier");
  const int n = size();
  const torch::Tensor token = torch::empty({0}, torch::kUInt8);
  if (direct()) {  // one round: a token to every other member, one from every other member
    for (int k = 1; k < n; ++k) channel_.sendChunk(op, modulo(rank() + k, n), 0, token);
    for (int k = 1; k < n; ++k)
      (void)channel_.receiveChunk(op, modulo(rank() - k, n), 0, torch::kUInt8, 0);
    channel_.finish(op);
    return;
  }
  uint64_t round = 0;
  for (int distance = 1; distance < n; distance *= 2, ++round) {
    channel_.sendChunk(op, modulo(rank() + distance, n), round, token);
    (void)channel_.receiveChunk(op, modulo(rank() - distance, n), round, torch::kUInt8, 0);
  }
  channel_.finish(op);
}

}  // namespace cairn
