// dataset_stream: streams every training sample of a tokens dataset, batch by batch in the
// sampler's shuffled order, under a memory limit, and prints what it saw as JSON (for
// tests/trainer/dataset_memory_test.py, which checks the sums against numpy).
//
//   dataset_stream --location DIR --block-length N --batch B --headroom-mb M [--control]
//
// The limit is RLIMIT_AS (what `ulimit -v` sets) = the process's virtual size once libtorch is
// loaded + M MiB: every allocation and every mapping counts, so a dataset several times M can
// only stream through if it is never held (or mapped) whole. --control instead allocates and fills
// a buffer the size of the dataset, as the loader did before (it read the whole file), and must
// fail under the same limit. One torch thread: a thread pool's stacks and arenas would take
// address space the limit is not about.
#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "core/Error.h"
#include "trainer/Dataset.h"
#include "trainer/Sampler.h"

namespace {

int64_t statusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::strlen(key) + 1));
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string location;
  int64_t block = 256, batch = 64, headroom_mb = 64;
  bool control = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--location")
      location = next();
    else if (a == "--block-length")
      block = std::stoll(next());
    else if (a == "--batch")
      batch = std::stoll(next());
    else if (a == "--headroom-mb")
      headroom_mb = std::stoll(next());
    else if (a == "--control")
      control = true;
    else {
      std::cerr << "dataset_stream: unknown argument " << a << "\n";
      return 2;
    }
  }
  try {
    cairn::DataOptions o;
    o.format = "tokens";
    o.location = location;
    o.block_length = block;
    o.test_fraction = 0;
    at::set_num_threads(1);
    const int64_t size_start_kb = statusKb("VmSize"), rss_start_kb = statusKb("VmRSS");
    const rlim_t limit = rlim_t(size_start_kb + headroom_mb * 1024) * 1024;
    const rlimit r{limit, limit};
    if (setrlimit(RLIMIT_AS, &r) != 0) {
      std::perror("setrlimit");
      return 1;
    }
    cairn::DatasetPair d = cairn::loadDatasets(o, 0);
    uint64_t bytes = 0;
    for (const cairn::ShardInfo& s : d.train->shards()) bytes += s.bytes;
    if (control) {
      try {
        std::vector<uint8_t> copy(bytes, 1);  // what reading the whole set into memory needs
        std::printf("{\"control_failed\": false, \"bytes\": %llu}\n",
                    static_cast<unsigned long long>(copy.size()));
      } catch (const std::bad_alloc&) {
        std::printf("{\"control_failed\": true, \"bytes\": %llu}\n",
                    static_cast<unsigned long long>(bytes));
      }
      return 0;
    }
    cairn::ShardSampler sampler(cairn::chunkSizes(*d.train, o, 1), 0, 1, {}, 1);
    const std::vector<int64_t> order = sampler.epochOrder(0);
    int64_t input_sum = 0, last_target_sum = 0, samples = 0, rss_anon_max_kb = 0,
            rss_file_max_kb = 0;
    const int64_t rss_anon_start_kb = statusKb("RssAnon"), rss_file_start_kb = statusKb("RssFile");
    for (size_t at = 0; at < order.size(); at += size_t(batch)) {
      const std::vector<int64_t> ids(order.begin() + at,
                                     order.begin() + std::min(order.size(), at + size_t(batch)));
      cairn::Batch b = d.train->get(ids, true);
      input_sum += b.inputs.sum().item<int64_t>();
      last_target_sum += b.targets.select(1, block - 1).sum().item<int64_t>();
      samples += b.inputs.size(0);
      if ((at / size_t(batch)) % 16 == 0) {
        rss_anon_max_kb = std::max(rss_anon_max_kb, statusKb("RssAnon"));
        rss_file_max_kb = std::max(rss_file_max_kb, statusKb("RssFile"));
      }
    }
    std::printf(
        "{\"samples\": %lld, \"input_sum\": %lld, \"last_target_sum\": %lld, \"bytes\": %llu, "
        "\"shards\": %zu, \"as_limit_kb\": %lld, \"vm_size_start_kb\": %lld, "
        "\"vm_rss_start_kb\": %lld, \"vm_hwm_kb\": %lld, \"rss_anon_start_kb\": %lld, "
        "\"rss_anon_max_kb\": %lld, \"rss_file_start_kb\": %lld, \"rss_file_max_kb\": %lld}\n",
        static_cast<long long>(samples), static_cast<long long>(input_sum),
        static_cast<long long>(last_target_sum), static_cast<unsigned long long>(bytes),
        d.train->shards().size(), static_cast<long long>(limit / 1024),
        static_cast<long long>(size_start_kb), static_cast<long long>(rss_start_kb),
        static_cast<long long>(statusKb("VmHWM")), static_cast<long long>(rss_anon_start_kb),
        static_cast<long long>(rss_anon_max_kb), static_cast<long long>(rss_file_start_kb),
        static_cast<long long>(rss_file_max_kb));
    return 0;
  } catch (const cairn::Error& e) {
    std::cerr << "dataset_stream: " << e.what() << "\n";
    return e.exitCode();
  }
}
