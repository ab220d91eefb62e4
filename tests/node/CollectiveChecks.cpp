#include "tests/node/CollectiveChecks.h"

#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

namespace cairn::testing {
namespace {

// Inputs and references are deterministic and every rank (thread) asks for the same ones: compute
// each once. Keys: (kind, rank or world size, numel, dtype, salt, reduce op).
using CacheKey = std::tuple<int, int, int64_t, int, int, int>;
std::mutex cache_mutex;
std::map<CacheKey, torch::Tensor> cache;

template <typename Make>
torch::Tensor cached(const CacheKey& key, Make make) {
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  torch::Tensor made = make();
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache.emplace(key, made).first->second;
}

}  // namespace

void clearCaches() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  cache.clear();
}

std::vector<int64_t> shapeFor(int64_t numel) {
  if (numel == 1000) return {10, 100};
  return {numel};
}

namespace {
torch::Tensor makeRankInput(int rank, int64_t numel, torch::ScalarType dtype, int salt) {
  auto generator = at::detail::createCPUGenerator(
      static_cast<uint64_t>(salt) * 1000003u + static_cast<uint64_t>(rank) * 7919u +
      static_cast<uint64_t>(numel));
  const auto shape = shapeFor(numel);
  switch (dtype) {
    case torch::kBool:
      return torch::randint(0, 2, shape, generator, torch::kInt64).to(torch::kBool);
    case torch::kUInt8:
      return torch::randint(0, 31, shape, generator, torch::kInt64).to(torch::kUInt8);
    case torch::kFloat32:
    case torch::kFloat64:
      return (torch::rand(shape, generator, torch::TensorOptions().dtype(torch::kFloat64)) * 8 - 4)
          .to(dtype);
    default:  // int32, int64, float16, bfloat16
      return torch::randint(-16, 17, shape, generator, torch::kInt64).to(dtype);
  }
}

}  // namespace

torch::Tensor rankInput(int rank, int64_t numel, torch::ScalarType dtype, int salt) {
  return cached({0, rank, numel, static_cast<int>(dtype), salt, 0},
                [&] { return makeRankInput(rank, numel, dtype, salt); })
      .clone();
}

torch::Tensor directReduction(int world_size, int64_t numel, torch::ScalarType dtype, int salt,
                              ReduceOp op) {
  return cached({1, world_size, numel, static_cast<int>(dtype), salt, static_cast<int>(op)}, [&] {
  std::vector<torch::Tensor> inputs;
  for (int r = 0; r < world_size; ++r) {
    torch::Tensor t = rankInput(r, numel, dtype, salt);
    inputs.push_back(torch::isFloatingType(dtype) ? t.to(torch::kFloat64) : t.to(torch::kInt64));
  }
  const torch::Tensor all = torch::stack(inputs);
  torch::Tensor reduced;
  switch (op) {
    case ReduceOp::kSum:
      reduced = dtype == torch::kBool ? (all.sum(0) > 0) : all.sum(0);
      break;
    case ReduceOp::kAverage:
      reduced = all.sum(0) / world_size;
      break;
    case ReduceOp::kMax:
      reduced = std::get<0>(all.max(0));
      break;
    case ReduceOp::kMin:
      reduced = std::get<0>(all.min(0));
      break;
  }
  return reduced.to(dtype);
  });
}

std::string compare(const torch::Tensor& actual, const torch::Tensor& expected) {
  std::ostringstream out;
  if (actual.scalar_type() != expected.scalar_type()) {
    out << "dtype " << dtypeName(actual.scalar_type()) << ", expected "
        << dtypeName(expected.scalar_type());
    return out.str();
  }
  if (actual.sizes() != expected.sizes()) {
    out << "shape " << actual.sizes() << ", expected " << expected.sizes();
    return out.str();
  }
  if (actual.numel() == 0) return "";
  const auto dtype = actual.scalar_type();
  if (!torch::isFloatingType(dtype)) {
    if (torch::equal(actual, expected)) return "";
    const auto where = (actual != expected).nonzero();
    out << where.size(0) << " elements differ, first at flat index "
        << where[0].item<int64_t>();
    return out.str();
  }
  double rtol = 1e-5, atol = 1e-5;
  if (dtype == torch::kFloat64) rtol = 1e-12, atol = 1e-12;
  if (dtype == torch::kFloat16) rtol = 1e-3, atol = 1e-3;
  if (dtype == torch::kBFloat16) rtol = 1e-2, atol = 1e-2;
  const torch::Tensor a = actual.to(torch::kFloat64), e = expected.to(torch::kFloat64);
  if (torch::allclose(a, e, rtol, atol)) return "";
  const torch::Tensor diff = (a - e).abs();
  out << "max abs difference " << diff.max().item<double>() << " (rtol " << rtol << ", atol "
      << atol << ")";
  return out.str();
}

namespace {

void expectMatch(std::vector<std::string>& failures, const std::string& what,
                 const torch::Tensor& actual, const torch::Tensor& expected) {
  const std::string difference = compare(actual, expected);
  if (!difference.empty()) failures.push_back(what + ": " + difference);
}

}  // namespace

CheckResult checkAllCollectives(ProcessGroup& group, torch::ScalarType dtype, int64_t numel) {
  CheckResult result;
  auto& failures = result.failures;
  const int n = group.size(), rank = group.rank();
  const bool floating = torch::isFloatingType(dtype);

  {
    torch::Tensor t = rankInput(rank, numel, dtype, 1);
    group.allReduce(t, ReduceOp::kSum);
    expectMatch(failures, "allReduce sum", t, directReduction(n, numel, dtype, 1, ReduceOp::kSum));
    result.all_reduce_sum = t;
  }
  {
    torch::Tensor t = rankInput(rank, numel, dtype, 2);
    group.allReduce(t, ReduceOp::kMax);
    expectMatch(failures, "allReduce max", t, directReduction(n, numel, dtype, 2, ReduceOp::kMax));
  }
  {
    torch::Tensor t = rankInput(rank, numel, dtype, 3);
    group.allReduce(t, ReduceOp::kMin);
    expectMatch(failures, "allReduce min", t, directReduction(n, numel, dtype, 3, ReduceOp::kMin));
  }
  if (floating) {
    torch::Tensor t = rankInput(rank, numel, dtype, 4);
    group.allReduce(t, ReduceOp::kAverage);
    expectMatch(failures, "allReduce average", t,
                directReduction(n, numel, dtype, 4, ReduceOp::kAverage));
  }
  if (numel == 1000) {  // a non-contiguous view, reduced through a copy and written back
    torch::Tensor base = rankInput(rank, numel, dtype, 5).reshape({100, 10}).clone();
    torch::Tensor view = base.t();
    group.allReduce(view, ReduceOp::kSum);
    expectMatch(failures, "allReduce sum (non-contiguous)", base,
                directReduction(n, numel, dtype, 5, ReduceOp::kSum).reshape({100, 10}));
  }
  {
    const int root = n - 1;
    torch::Tensor t = rank == root ? rankInput(root, numel, dtype, 6)
                                   : torch::zeros(shapeFor(numel), torch::TensorOptions().dtype(dtype));
    group.broadcast(t, root);
    expectMatch(failures, "broadcast", t, rankInput(root, numel, dtype, 6));
  }
  {
    const int root = n / 2;
    torch::Tensor t = rankInput(rank, numel, dtype, 7);
    group.reduce(t, root, ReduceOp::kSum);
    expectMatch(failures, rank == root ? "reduce (root)" : "reduce (non-root left unchanged)", t,
                rank == root ? directReduction(n, numel, dtype, 7, ReduceOp::kSum)
                             : rankInput(rank, numel, dtype, 7));
  }
  {
    auto gathered = group.allGather(rankInput(rank, numel, dtype, 8));
    if (gathered.size() != static_cast<size_t>(n))
      failures.push_back("allGather returned " + std::to_string(gathered.size()) + " tensors");
    else
      for (int r = 0; r < n; ++r)
        expectMatch(failures, "allGather [" + std::to_string(r) + "]", gathered[r],
                    rankInput(r, numel, dtype, 8));
  }
  {
    const int root = n > 1 ? 1 : 0;
    auto gathered = group.gather(rankInput(rank, numel, dtype, 9), root);
    if (rank != root) {
      if (!gathered.empty()) failures.push_back("gather returned tensors on a non-root member");
    } else if (gathered.size() != static_cast<size_t>(n)) {
      failures.push_back("gather returned " + std::to_string(gathered.size()) + " tensors");
    } else {
      for (int r = 0; r < n; ++r)
        expectMatch(failures, "gather [" + std::to_string(r) + "]", gathered[r],
                    rankInput(r, numel, dtype, 9));
    }
  }
  {
    const int root = 0;
    std::vector<torch::Tensor> inputs;
    if (rank == root)
      for (int r = 0; r < n; ++r) inputs.push_back(rankInput(r, numel, dtype, 10));
    torch::Tensor out = torch::zeros(shapeFor(numel), torch::TensorOptions().dtype(dtype));
    group.scatter(out, inputs, root);
    expectMatch(failures, "scatter", out, rankInput(rank, numel, dtype, 10));
  }
  group.barrier();
  return result;
}

}  // namespace cairn::testing
