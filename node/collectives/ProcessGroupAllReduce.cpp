// ProcessGroup::allReduce (ProcessGroup.h) and its algorithms: the pipelined ring (one loop, its
// chunks plain or encoded by a codec), the direct exchanges of small groups, and the whole
// exchange of tiny tensors. The other collectives are in ProcessGroup.cpp.
#include "node/collectives/ProcessGroup.h"

#include <algorithm>
#include <vector>

#include "core/Error.h"
#include "core/WireCompression.h"
#include "node/collectives/RingSchedule.h"

namespace cairn {
namespace {

using ring_schedule::modulo;
using ring_schedule::part;
using ring_schedule::Range;
using ring_schedule::slice;
using ring_schedule::subrange;
using ring_schedule::windowedRing;
using Operation = CollectiveChannel::Operation;

// Direct groups all-reduce tensors up to this size by one whole exchange (wholeExchangeAllReduce):
// the rings' join flags (8 bytes per member, up to 8 members), recovery votes and BatchNorm
// counters, a few bytes each.
constexpr int64_t kWholeExchangeBytes = 64;

// How a float32 chunk of an all-reduce travels under a codec (wire.sync; ProcessGroup.h): its wire
// dtype and element count, its encoding, its decoding into float32, and the vetting of an int8
// chunk before use. kFp32: the tensor's own dtype, sent as it is. One piece for the ring and the
// direct all-reduce.
class ChunkWire {
 public:
  ChunkWire(ChunkCodec codec, torch::ScalarType dtype, const std::string& group)
      : compressed_(codec != ChunkCodec::kFp32), bf16_(codec == ChunkCodec::kBf16),
        dtype_(dtype), group_(group) {}
  bool compressed() const { return compressed_; }
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
  // A received chunk of `k` values as a reduction can take it: int8 decoded into float32; any
  // other chunk as it is (it may borrow the sender's memory: only read; bfloat16 is widened by
  // the reduction's conversion to its accumulation dtype).
  torch::Tensor readable(const torch::Tensor& in, int64_t k) const {
    if (!compressed_ || bf16_) return in;
    torch::Tensor values = torch::empty({k}, torch::kFloat32);
    decodeInto(in, values);
    return values;
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

// acc ← acc ∘ c in `acc_type` (float16/bfloat16 contributions in float32); the first contribution
// starts `acc` as a copy. The direct exchanges reduce the members' contributions in rank order
// this way, so every member that reduces the same inputs gets the same bits.
void accumulate(torch::Tensor& acc, const torch::Tensor& c, torch::ScalarType acc_type,
                ReduceOp reduce_op) {
  if (!acc.defined())
    acc = c.to(acc_type, /*non_blocking=*/false, /*copy=*/true);
  else if (c.scalar_type() == acc_type)
    reduceInto(acc, c, reduce_op);
  else
    reduceInto(acc, c.to(acc_type), reduce_op);
}

// The chunks of the ring all-reduce (ringAllReduce below) in the tensor's dtype: views of the
// tensor, reduced in place. Reduced-precision dtypes reduce in a float32 copy: partial sums travel
// in float32 and the final value is rounded once.
class PlainRingChunks {
 public:
  PlainRingChunks(CollectiveChannel& channel, torch::Tensor& flat, ReduceOp reduce_op)
      : channel_(channel),
        flat_(flat),
        reduce_op_(reduce_op),
        dtype_(flat.scalar_type()),
        acc_type_(accumulationType(dtype_)),
        work_(acc_type_ == dtype_ ? flat : flat.to(acc_type_)) {}

  // Sent at a reduce-scatter hop, and at an all-gather hop, for segment `r` (number `j`).
  torch::Tensor reducing(const Range& r) const { return slice(work_, r); }
  torch::Tensor gathering(const Range& r, int64_t /*j*/) const { return slice(flat_, r); }
  // A reduce-scatter hop's chunk for segment `r`, reduced into ours; `last`: the segment now holds
  // the full reduction.
  void reduce(Operation& op, int from, uint64_t t, const Range& r, int64_t /*j*/, bool last) {
    torch::Tensor in = channel_.receiveChunk(op, from, t, acc_type_, r.size());
    torch::Tensor acc = slice(work_, r);
    reduceInto(acc, in, reduce_op_);
    if (last) {
      if (reduce_op_ == ReduceOp::kAverage) acc.div_(channel_.size());
      if (acc_type_ != dtype_) slice(flat_, r).copy_(acc);
    }
  }
  // An all-gather hop's chunk: a finished segment, copied into place.
  void gather(Operation& op, int from, uint64_t t, const Range& r, int64_t /*j*/) {
    slice(flat_, r).copy_(channel_.receiveChunk(op, from, t, dtype_, r.size()));
  }

 private:
  CollectiveChannel& channel_;
  torch::Tensor& flat_;
  const ReduceOp reduce_op_;
  const torch::ScalarType dtype_, acc_type_;
  torch::Tensor work_;
};

// The chunks of the ring all-reduce with a compressed codec (float32 kSum/kAverage; the header).
// A reduce-scatter hop sends its float32 partial (its own values at step 0) encoded; the receiver
// decodes it into float32 and adds it to its own. The member finishing a segment (averaging it
// if asked) encodes it once, writes the decoded values into its own tensor, and keeps the bytes;
// the all-gather forwards those bytes unchanged, every receiver decoding them: all members hold
// the same values.
class EncodedRingChunks {
 public:
  EncodedRingChunks(CollectiveChannel& channel, torch::Tensor& flat, ReduceOp reduce_op,
                    ChunkCodec codec, int64_t segments)
      : channel_(channel),
        flat_(flat),
        reduce_op_(reduce_op),
        wire_(codec, torch::kFloat32, channel.groupId()),
        gathered_(static_cast<size_t>(segments)) {}

  torch::Tensor reducing(const Range& r) const { return wire_.encode(slice(flat_, r)); }
  torch::Tensor gathering(const Range& /*r*/, int64_t j) const { return gathered_[size_t(j)]; }
  void reduce(Operation& op, int from, uint64_t t, const Range& r, int64_t j, bool last) {
    torch::Tensor in = receive(op, from, t, r);
    torch::Tensor own = slice(flat_, r);
    torch::Tensor partial = torch::empty({r.size()}, torch::kFloat32);
    wire_.decodeInto(in, partial);
    own.add_(partial);
    if (last) {
      if (reduce_op_ == ReduceOp::kAverage) own.div_(channel_.size());
      gathered_[size_t(j)] = wire_.encode(own);
      wire_.decodeInto(gathered_[size_t(j)], own);
    }
  }
  void gather(Operation& op, int from, uint64_t t, const Range& r, int64_t j) {
    torch::Tensor in = receive(op, from, t, r);
    wire_.decodeInto(in, slice(flat_, r));
    gathered_[size_t(j)] = in;  // forwarded as received (read only)
  }

 private:
  torch::Tensor receive(Operation& op, int from, uint64_t t, const Range& r) {
    return channel_.receiveChunk(op, from, t, wire_.type(), wire_.numel(r.size()),
                                 wire_.checkFor(r.size()));
  }

  CollectiveChannel& channel_;
  torch::Tensor& flat_;
  const ReduceOp reduce_op_;
  const ChunkWire wire_;
  // The all-gather payload of segment j: what this member finished or last received.
  std::vector<torch::Tensor> gathered_;
};

// The ring loop of allReduce over `total` elements cut into n blocks of `m` segments each (see
// ProcessGroup::ringAllReduce); `chunks` says what travels and what becomes of what arrives.
template <typename Chunks>
void reduceScatterAllGather(CollectiveChannel& channel, Operation& op, int64_t total, int64_t m,
                            Chunks& chunks) {
  const int n = channel.size();
  auto segment = [&](int block, int64_t j) { return subrange(part(total, n, block), m, j); };
  const int rank = channel.rank();
  const int right = modulo(rank + 1, n), left = modulo(rank - 1, n);
  const int64_t reduce_steps = n - 1;
  windowedRing(
      static_cast<uint64_t>(2 * reduce_steps * m), static_cast<uint64_t>(m),
      static_cast<uint64_t>(channel.options().max_in_flight),
      [&](uint64_t t) {
        const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
        const Range r = segment(modulo(rank - s, n), j);
        channel.sendChunk(op, right, t,
                          s < reduce_steps ? chunks.reducing(r) : chunks.gathering(r, j));
      },
      [&](uint64_t t) {
        const int64_t s = static_cast<int64_t>(t / m), j = static_cast<int64_t>(t % m);
        const Range r = segment(modulo(rank - s - 1, n), j);
        if (s < reduce_steps)  // the last step leaves this segment of block rank+1 finished
          chunks.reduce(op, left, t, r, j, /*last=*/s == reduce_steps - 1);
        else
          chunks.gather(op, left, t, r, j);
      });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// all_reduce: ring reduce-scatter then ring all-gather over 2(n−1) steps. The tensor is cut into
// n blocks (one per rank, sizes differing by at most one element) and every block into m
// segments. At step s this node sends segment j of block (rank − s) to its right neighbour and
// receives segment j of block (rank − s − 1) from its left one: reduced into place for s < n−1,
// copied for s ≥ n−1. Messages are numbered t = s·m + j. Message t may be sent once message t−m
// has arrived (its data depends on it) and while at most max_in_flight messages are sent ahead
// of those received — the window that lets a ring of blocking sends never deadlock. With a
// compressed codec, the same blocks, segments, message numbers and window, every chunk encoded
// (EncodedRingChunks above).
void ProcessGroup::ringAllReduce(Operation& op, torch::Tensor& flat, ReduceOp reduce_op,
                                 ChunkCodec codec) {
  const int n = size();
  const int64_t total_elements = flat.numel();
  const int64_t max_block = (total_elements + n - 1) / n;
  const int64_t segment_elements = segmentElements(flat.element_size());
  const int64_t m = std::max<int64_t>(1, (max_block + segment_elements - 1) / segment_elements);
  if (codec == ChunkCodec::kFp32) {
    PlainRingChunks chunks(channel_, flat, reduce_op);
    reduceScatterAllGather(channel_, op, total_elements, m, chunks);
  } else {
    EncodedRingChunks chunks(channel_, flat, reduce_op, codec, m);
    reduceScatterAllGather(channel_, op, total_elements, m, chunks);
  }
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
  const torch::ScalarType acc_type = accumulationType(flat.scalar_type());
  const ChunkWire wire(codec, flat.scalar_type(), groupId());

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
    if (from == rank) {
      accumulate(acc, own, acc_type, reduce_op);
      continue;
    }
    torch::Tensor in = channel_.receiveChunk(op, from, 0, wire.type(), wire.numel(mine.size()),
                                             wire.checkFor(mine.size()));
    accumulate(acc, wire.readable(in, mine.size()), acc_type, reduce_op);
  }
  if (reduce_op == ReduceOp::kAverage) acc.div_(n);
  // The finished block: adopted here, then sent to every other member as these bytes.
  torch::Tensor finished;
  if (wire.compressed()) {
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
    accumulate(acc, c, acc_type, reduce_op);
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
    const ChunkCodec chunk_codec = compressed ? codec : ChunkCodec::kFp32;
    const int64_t max_block = (flat.numel() + size() - 1) / size();
    if (direct() && !compressed &&
        flat.numel() * int64_t(flat.element_size()) <= kWholeExchangeBytes)
      wholeExchangeAllReduce(op, flat, reduce_op);
    else if (direct() && max_block <= segmentElements(flat.element_size()))
      directAllReduce(op, flat, reduce_op, chunk_codec);
    else
      ringAllReduce(op, flat, reduce_op, chunk_codec);
    if (!tensor.is_contiguous()) tensor.copy_(flat.view(tensor.sizes()));
  }
  channel_.finish(op);
}

}  // namespace cairn
