// Compressed ring syncs (training_definition.wire.sync, ProcessGroup::allReduce's ChunkCodec):
// ranks as threads over inproc://. Every compressed all-reduce is compared, bit for bit, with an
// independent simulation (of the direct exchange where the group uses it, directReference, else)
// of the ring written here from the codecs of core/WireCompression.h (the
// scalar bf16 rounding and the int8 block encoder, not torch's casts): for each block and segment,
// the member owning the block starts with its own values, every hop rounds the float32 partial
// through the codec and adds the next member's float32 values, the last one averages, and the
// result is rounded once more — the values every member adopts. Forged chunks (wrong dtype, size
// or invalid int8 content) are dropped and counted, naming the claimed sender.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "core/WireCompression.h"
#include "node/collectives/ProcessGroup.h"
#include "node/transport/ZmqTransport.h"

namespace cairn {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> rankNames(int n) {
  std::vector<std::string> names;
  for (int r = 0; r < n; ++r) names.push_back("rank" + std::to_string(r));
  return names;
}

// `direct`: the group may use the direct all-reduce (ProcessGroupOptions::direct_max_members,
// the default); false: always the ring.
ProcessGroupOptions testOptions(ChunkCodec codec = ChunkCodec::kFp32, bool direct = false) {
  ProcessGroupOptions options;
  options.codec = codec;
  options.direct_max_members = direct ? 16 : 0;
  options.timeout = 20s;          // a hang fails the test instead of stalling it
  options.segment_bytes = 4096;   // 1024 float32 per segment: several segments per block
  return options;
}

// Runs body(rank, group) on one thread per rank; returns each rank's error ("" when none).
std::vector<std::string> runRanks(int n, const ProcessGroupOptions& options,
                                  const std::function<void(int, ProcessGroup&)>& body) {
  static std::atomic<int> run_counter{0};
  const std::string prefix = "inproc://synccomp" + std::to_string(run_counter++) + "_";
  const auto names = rankNames(n);
  zmq::context_t context;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        ZmqTransport transport(context, names[r], prefix + names[r]);
        for (int p = 0; p < n; ++p)
          if (p != r) transport.addPeer(names[p], prefix + names[p]);
        Mailbox mailbox(transport);
        ProcessGroup group(mailbox, "test", names, names[r], options);
        body(r, group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The codec's round trip of float32 values, from the scalar codecs.
torch::Tensor syncCompressionRoundTrip(const torch::Tensor& x, ChunkCodec codec) {
  torch::Tensor in = x.contiguous();
  torch::Tensor out = torch::empty_like(in);
  const float* p = in.data_ptr<float>();
  float* q = out.data_ptr<float>();
  const int64_t k = in.numel();
  if (codec == ChunkCodec::kBf16) {
    for (int64_t i = 0; i < k; ++i) q[i] = wire::fromBf16(wire::toBf16(p[i]));
  } else {
    std::vector<uint8_t> bytes(size_t(wire::int8BlocksBytes(k, kInt8Block)));
    wire::encodeInt8Blocks(p, k, kInt8Block, bytes.data());
    EXPECT_EQ(wire::checkInt8Blocks(bytes.data(), k, kInt8Block), "");
    wire::decodeInt8Blocks(bytes.data(), k, kInt8Block, q);
  }
  return out;
}

// The ring's result, simulated: blocks of near-equal size (one per rank), each cut into m
// segments of at most `segment_elements`; block b starts at rank b and travels b+1, …, b−1.
torch::Tensor ringReference(const std::vector<torch::Tensor>& x, ChunkCodec codec, bool average,
                            int64_t segment_elements) {
  const int64_t n = int64_t(x.size()), total = x[0].numel();
  auto part = [](int64_t begin, int64_t size, int64_t parts, int64_t i) {
    return std::make_pair(begin + size * i / parts, begin + size * (i + 1) / parts);
  };
  const int64_t max_block = (total + n - 1) / n;
  const int64_t m = std::max<int64_t>(1, (max_block + segment_elements - 1) / segment_elements);
  torch::Tensor out = torch::empty({total});
  for (int64_t b = 0; b < n; ++b) {
    const auto block = part(0, total, n, b);
    for (int64_t j = 0; j < m; ++j) {
      const auto seg = part(block.first, block.second - block.first, m, j);
      const int64_t len = seg.second - seg.first;
      torch::Tensor p = x[size_t(b)].narrow(0, seg.first, len).clone();
      for (int64_t k = 1; k < n; ++k)
        p = syncCompressionRoundTrip(p, codec).add_(x[size_t((b + k) % n)].narrow(0, seg.first, len));
      if (average) p.div_(n);
      out.narrow(0, seg.first, len).copy_(syncCompressionRoundTrip(p, codec));
    }
  }
  return out;
}

// The direct all-reduce's result, simulated: block b (near-equal blocks, one per rank) is summed
// by rank b in rank order, its own values exact and every other member's rounded once through
// the codec; averaged; rounded once more — the values every member adopts.
torch::Tensor directReference(const std::vector<torch::Tensor>& x, ChunkCodec codec,
                              bool average) {
  const int64_t n = int64_t(x.size()), total = x[0].numel();
  torch::Tensor out = torch::empty({total});
  for (int64_t b = 0; b < n; ++b) {
    const int64_t begin = total * b / n, len = total * (b + 1) / n - begin;
    torch::Tensor p;
    for (int64_t s = 0; s < n; ++s) {
      torch::Tensor c = x[size_t(s)].narrow(0, begin, len);
      if (s != b) c = syncCompressionRoundTrip(c, codec);
      if (s == 0)
        p = c.clone();
      else
        p.add_(c);
    }
    if (average) p.div_(n);
    out.narrow(0, begin, len).copy_(syncCompressionRoundTrip(p, codec));
  }
  return out;
}

// What a group with testOptions(codec, direct) computes: the direct simulation where every
// block fits one segment, else the ring's.
torch::Tensor reference(const std::vector<torch::Tensor>& x, ChunkCodec codec, bool average,
                        bool direct) {
  const int64_t n = int64_t(x.size());
  const int64_t segment_elements = int64_t(testOptions().segment_bytes / 4);
  if (direct && n > 1 && (x[0].numel() + n - 1) / n <= segment_elements)
    return directReference(x, codec, average);
  return ringReference(x, codec, average, segment_elements);
}

std::vector<torch::Tensor> inputs(int n, int64_t numel) {
  std::vector<torch::Tensor> x;
  auto gen = at::detail::createCPUGenerator(1234);
  for (int r = 0; r < n; ++r) {
    // Scales differing along the tensor (as a bucket of several parameters), a few exact zeros.
    torch::Tensor t = torch::randn({numel}, gen) *
                      torch::linspace(0.01, 3.0, numel).pow(2);
    if (numel > 1000) t.narrow(0, 500, 300).zero_();
    x.push_back(t);
  }
  return x;
}

struct Outcome {
  std::vector<torch::Tensor> results;
  std::vector<ProcessGroupStats> stats;
};

Outcome allReduceAll(const std::vector<torch::Tensor>& x, ReduceOp op, ChunkCodec codec,
                     bool direct = false) {
  const int n = int(x.size());
  Outcome o{std::vector<torch::Tensor>(n), std::vector<ProcessGroupStats>(n)};
  auto errors = runRanks(n, testOptions(codec, direct), [&](int r, ProcessGroup& g) {
    torch::Tensor t = x[size_t(r)].clone();
    g.allReduce(t, op);
    o.results[size_t(r)] = t;
    o.stats[size_t(r)] = g.stats();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  return o;
}

// (n, numel, codec, direct all-reduce allowed)
using Case = std::tuple<int, int64_t, ChunkCodec, bool>;
class SyncCompression : public ::testing::TestWithParam<Case> {};

TEST_P(SyncCompression, AverageEqualsSimulationOnEveryMember) {
  const auto [n, numel, codec, direct] = GetParam();
  const auto x = inputs(n, numel);
  const Outcome exact = allReduceAll(x, ReduceOp::kAverage, ChunkCodec::kFp32, direct);
  const Outcome got = allReduceAll(x, ReduceOp::kAverage, codec, direct);
  const torch::Tensor expected = reference(x, codec, true, direct);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(got.results[size_t(r)].defined()) << "rank " << r;
    // Every member holds the same values, bit for bit: the simulated ring's (or direct
    // exchange's).
    EXPECT_TRUE(torch::equal(got.results[size_t(r)], expected)) << "rank " << r;
  }
  // The codec made a difference (the test can fail), and a bounded one: every hop rounds a
  // partial sum of at most n·max|x| — bf16 by at most 2^-9 of it, int8 by half a step of its
  // block's scale, max/127/2 — and the result is rounded once more (the direct exchange rounds
  // each contribution once: within the same bound).
  // (Blocks of one value are exact in int8 — q = ±127 — so the 3-value case does not assert it.)
  if (numel > 100) {
    EXPECT_FALSE(torch::equal(got.results[0], exact.results[0]));
  }
  const double max_abs = torch::stack(x).abs().max().item<double>();
  const double per_rounding = codec == ChunkCodec::kBf16 ? std::ldexp(1.0, -9) : 0.5 / 127;
  // Hop k rounds a partial of at most k·max: Σ k·max·r / n = (n−1)/2·max·r after the division,
  // plus max·r for the final rounding; n·max·r bounds both.
  const double bound = n * max_abs * per_rounding;
  const double err = (got.results[0] - exact.results[0]).abs().max().item<double>();
  EXPECT_LE(err, bound) << "max |compressed − fp32| " << err;
  // The bytes: half of fp32 for bf16; for int8 a quarter plus one scale per block of a chunk
  // (chunks of one value carry 4 + 1 bytes: int8 pays off only for real buckets).
  // (A direct group's fp32 run of at most 64 bytes takes the whole exchange, (n−1)·N bytes, not
  // the blocks the compressed run sends: no like-for-like ratio there.)
  if (direct && numel * 4 <= 64) return;
  const double ratio = double(got.stats[0].bytes_sent) / double(exact.stats[0].bytes_sent);
  if (codec == ChunkCodec::kBf16) {
    EXPECT_DOUBLE_EQ(ratio, 0.5);
  } else if (numel > 1000) {
    EXPECT_LE(ratio, 0.25 * (1 + 4.0 / kInt8Block) + 0.01);
  }
}

std::string caseName(const ::testing::TestParamInfo<Case>& info) {
  const auto [n, numel, codec, direct] = info.param;
  return std::string(toString(codec)) + "_n" + std::to_string(n) + "_numel" +
         std::to_string(numel) + (direct ? "_direct" : "");
}

// 10007 elements in segments of 1024: several segments per block, int8 blocks cut short at a
// segment's end; 700: one segment per block; 3: blocks of one element, some ranks with none.
INSTANTIATE_TEST_SUITE_P(Ring, SyncCompression,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values<int64_t>(10007, 700, 3),
                                            ::testing::Values(ChunkCodec::kBf16,
                                                              ChunkCodec::kInt8),
                                            ::testing::Values(false)),
                         caseName);
// The direct all-reduce (small groups, blocks of one segment): 700 and 3 go direct, 10007 (blocks
// of several segments) still takes the ring.
INSTANTIATE_TEST_SUITE_P(Direct, SyncCompression,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values<int64_t>(10007, 700, 3),
                                            ::testing::Values(ChunkCodec::kBf16,
                                                              ChunkCodec::kInt8),
                                            ::testing::Values(true)),
                         caseName);

// A sum is compressed too (same path without the division); integer max-reductions and float64
// ignore the codec and stay exact.
TEST(SyncCompressionScope, SumCompressedOtherDtypesAndMaxExact) {
  const int n = 3;
  const auto x = inputs(n, 2000);
  const Outcome sum = allReduceAll(x, ReduceOp::kSum, ChunkCodec::kBf16);
  EXPECT_TRUE(torch::equal(sum.results[1], ringReference(x, ChunkCodec::kBf16, false, 1024)));
  std::vector<torch::Tensor> d, l;
  for (const auto& t : x) {
    d.push_back(t.to(torch::kFloat64));
    l.push_back((t * 100).to(torch::kLong));
  }
  for (ChunkCodec codec : {ChunkCodec::kBf16, ChunkCodec::kInt8}) {
    const Outcome got = allReduceAll(d, ReduceOp::kAverage, codec);
    const Outcome exact = allReduceAll(d, ReduceOp::kAverage, ChunkCodec::kFp32);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(torch::equal(got.results[size_t(r)], exact.results[size_t(r)]));
    const Outcome mx = allReduceAll(l, ReduceOp::kMax, codec);
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(torch::equal(mx.results[size_t(r)], std::get<0>(torch::stack(l).max(0))));
  }
}

// Forged chunks claiming to be rank0, queued at rank1 before the group starts: the wrong dtype
// (float32 where bf16 / int8 bytes are due), the wrong size, and (int8) the right size with an
// invalid scale or a -128. Each is dropped and counted; the real all-reduce still gives the
// simulated ring's values.
TEST(SyncCompressionForgery, WrongDtypeSizeOrContentIsDropped) {
  for (bool direct : {false, true})
  for (ChunkCodec codec : {ChunkCodec::kBf16, ChunkCodec::kInt8}) {
    zmq::context_t context;
    const std::string prefix = std::string("inproc://forge_") + toString(codec) +
                               (direct ? "_direct_" : "_");
    ZmqTransport intruder(context, "intruder", prefix + "x");
    intruder.addPeer("rank1", prefix + "rank1");
    auto forged = [](torch::Tensor t) {
      Message m;
      m.kind = MessageKind::kCollective;
      m.sender = "rank0";
      m.tag = "coll:test";
      m.step = 0;
      m.microbatch = 0;  // rank0's first chunk to rank1: 50 values (ring: block 0; direct:
                         // rank0's part of block 1)
      m.tensors.push_back({"", t});
      return m;
    };
    std::vector<torch::Tensor> bad = {torch::zeros({50}), torch::zeros({49}, torch::kBFloat16)};
    if (codec == ChunkCodec::kInt8) {
      const int64_t bytes = wire::int8BlocksBytes(50, kInt8Block);
      torch::Tensor nan_scale = torch::zeros({bytes}, torch::kUInt8);
      const float nan = std::nanf("");
      std::memcpy(nan_scale.data_ptr<uint8_t>(), &nan, 4);
      torch::Tensor minus128 = torch::zeros({bytes}, torch::kUInt8);
      minus128[10] = 0x80;
      bad = {torch::zeros({50}), torch::zeros({bytes + 1}, torch::kUInt8), nan_scale, minus128};
    }
    for (const auto& t : bad) ASSERT_EQ(intruder.send("rank1", forged(t), 1s), SendStatus::kSent);

    const auto x = inputs(2, 100);
    std::vector<torch::Tensor> results(2);
    ProcessGroupStats rank1;
    std::string errors[2];
    std::thread threads[2];
    std::atomic<bool> forgeries_queued{false};
    for (int r = 0; r < 2; ++r)
      threads[r] = std::thread([&, r] {
        try {
          const auto names = rankNames(2);
          ZmqTransport transport(context, names[r], prefix + names[r]);
          transport.addPeer(names[1 - r], prefix + names[1 - r]);
          Mailbox mailbox(transport);
          ProcessGroup group(mailbox, "test", names, names[r], testOptions(codec, direct));
          if (r == 1) {
            // The forgeries are in rank1's mailbox, in order, before rank0 sends anything.
            std::vector<Message> queued;
            while (queued.size() < bad.size()) {
              auto m = mailbox.receive([](const Message& m) { return m.tag == "coll:test"; }, 5s);
              if (!m) throw std::runtime_error("the forged chunks did not arrive");
              queued.push_back(std::move(*m));
            }
            for (auto it = queued.rbegin(); it != queued.rend(); ++it) mailbox.putBack(*it);
            forgeries_queued = true;
          } else {
            while (!forgeries_queued) std::this_thread::sleep_for(1ms);
          }
          results[size_t(r)] = x[size_t(r)].clone();
          group.allReduce(results[size_t(r)], ReduceOp::kAverage);
          if (r == 1) rank1 = group.stats();
        } catch (const std::exception& e) {
          errors[r] = e.what();
          forgeries_queued = true;
        }
      });
    for (auto& t : threads) t.join();
    ASSERT_EQ(errors[0], "") << toString(codec);
    ASSERT_EQ(errors[1], "") << toString(codec);
    const torch::Tensor expected = reference(x, codec, true, direct);
    for (const auto& r : results) EXPECT_TRUE(torch::equal(r, expected)) << toString(codec);
    EXPECT_EQ(rank1.dropped_malformed, bad.size()) << toString(codec);
  }
}

}  // namespace
}  // namespace cairn
