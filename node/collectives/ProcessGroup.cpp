// ProcessGroup (ProcessGroup.h): construction, argument checks, and every collective but
// allReduce (broadcast, reduce, allGather, gather, scatter, barrier); allReduce and its
// algorithms are in ProcessGroupAllReduce.cpp.
#include "node/collectives/ProcessGroup.h"

#include <algorithm>
#include <utility>

#include "core/Error.h"
#include "node/collectives/RingSchedule.h"

namespace cairn {

using ring_schedule::modulo;
using ring_schedule::part;
using ring_schedule::Range;
using ring_schedule::slice;
using ring_schedule::windowedRing;

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

// barrier: small groups (direct()) in one round; larger ones by dissemination — in round k
// (distance d = 2^k) send to rank + d, hear from rank − d. After ⌈log2 n⌉ rounds every member has
// heard, directly or not, from every other.
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
