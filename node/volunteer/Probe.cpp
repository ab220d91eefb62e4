#include "node/volunteer/Probe.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include "core/Error.h"
#include "core/Log.h"
#include "core/MatmulSpeed.h"
#include "node/transport/ZmqTransport.h"

namespace cairn {
namespace {

// RAII over an hwloc topology.
class Topology {
 public:
  Topology() {
    if (hwloc_topology_init(&topology_) != 0 || hwloc_topology_load(topology_) != 0)
      CAIRN_THROW(InternalError, "hwloc could not read this machine's topology");
  }
  ~Topology() { hwloc_topology_destroy(topology_); }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  hwloc_topology_t get() const { return topology_; }

 private:
  hwloc_topology_t topology_{};
};

// The cgroup memory limit in bytes, if one is set (v2: memory.max, v1: memory.limit_in_bytes).
std::optional<double> cgroupMemoryLimit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") continue;
    try {
      const double bytes = std::stod(text);
      if (bytes > 0 && bytes < 1e18) return bytes;  // v1 reports ~2^63 for "no limit"
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

constexpr const char* kProbeJob = "cairn-probe";

}  // namespace

void probeMemoryAndCores(MachineProbe* probe) {
  Topology topology;
  hwloc_obj_t root = hwloc_get_root_obj(topology.get());
  double bytes = static_cast<double>(root->total_memory);
  // hwloc reads the memory from /sys; where /sys is missing (a chroot, some containers) it
  // finds none: the kernel's own count of physical pages, as free(1) shows it, instead.
  if (bytes <= 0) bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  if (auto limit = cgroupMemoryLimit()) bytes = std::min(bytes, *limit);
  probe->ram_gb = bytes / 1e9;
  int cores = hwloc_get_nbobjs_by_type(topology.get(), HWLOC_OBJ_CORE);
  if (cores <= 0) cores = hwloc_get_nbobjs_by_type(topology.get(), HWLOC_OBJ_PU);
  probe->cores = std::max(cores, 1);
}

double probeComputeGflops(int size, std::chrono::milliseconds duration, int threads) {
  // A provider runs its stage with torch's intra-op threads (the node's thread count): the probe
  // measures with the same count.
  if (threads <= 0) {
    MachineProbe machine;
    probeMemoryAndCores(&machine);
    threads = machine.cores;  // what a provider's "threads" defaults to: one per core
  }
  return measureMatmulGflops(threads, size, duration);
}

namespace {
// "tcp://127.0.0.1:41873" → "127.0.0.1:41873"
std::string hostPortOf(const std::string& endpoint) {
  const std::string scheme = "tcp://";
  return endpoint.rfind(scheme, 0) == 0 ? endpoint.substr(scheme.size()) : endpoint;
}
}  // namespace

void serveBandwidthProbes(const std::string& address, int max_probes,
                          std::chrono::milliseconds idle_timeout,
                          const std::function<void(const std::string&)>& on_listening) {
  zmq::context_t context;
  ZmqTransport transport(context, "probe-server", "tcp://" + address);
  const std::string bound = hostPortOf(transport.boundEndpoint());
  CAIRN_INFO("serving bandwidth probes on ", bound);
  if (on_listening) on_listening(bound);
  for (int served = 0; max_probes == 0 || served < max_probes;) {
    auto hello = transport.receive(idle_timeout);
    if (!hello) break;
    if (hello->kind != MessageKind::kControl || hello->job_id != kProbeJob) continue;
    // hello: sender's name in `sender`, its address in `text`, message count in `step`.
    const uint64_t count = hello->step;
    if (count == 0 || count > 100000 || hello->text.empty()) continue;
    transport.addPeer(hello->sender + "@" + hello->text, "tcp://" + hello->text);
    uint64_t received = 0;
    while (received < count) {
      auto m = transport.receive(std::chrono::seconds(30));
      if (!m) break;
      if (m->job_id == kProbeJob && m->kind == MessageKind::kActivation) ++received;
    }
    Message ack;
    ack.kind = MessageKind::kControl;
    ack.job_id = kProbeJob;
    ack.step = received;
    (void)transport.send(hello->sender + "@" + hello->text, ack, std::chrono::seconds(10));
    ++served;
  }
  transport.flushAndClose(std::chrono::seconds(2));
}

namespace {

// Loopback: a server thread on a port the kernel picks, which it reports once it listens; its
// address goes to *target.
std::thread startLoopbackServer(std::chrono::seconds timeout, std::string* target) {
  std::promise<std::string> listening;
  std::future<std::string> bound = listening.get_future();
  std::thread server([timeout, &listening] {
    bool reported = false;
    try {
      serveBandwidthProbes("127.0.0.1:*", 1, timeout, [&](const std::string& address) {
        listening.set_value(address);
        reported = true;
      });
    } catch (const std::exception& e) {
      CAIRN_ERROR("loopback probe server: ", e.what());
      if (!reported) listening.set_exception(std::current_exception());
    }
  });
  try {
    *target = bound.get();
  } catch (...) {
    server.join();
    throw;
  }
  return server;
}

// Sends `megabytes` MiB to the probe server at `target`; Mbit/s until its acknowledgement.
double timeTransfer(const std::string& target, int megabytes, std::chrono::seconds timeout) {
  zmq::context_t context;
  ZmqTransport transport(context, "probe", "tcp://127.0.0.1:*");
  const std::string self_address = hostPortOf(transport.boundEndpoint());
  transport.addPeer("server", "tcp://" + target);
  Message hello;
  hello.kind = MessageKind::kControl;
  hello.job_id = kProbeJob;
  hello.sender = "probe";
  hello.text = self_address;
  hello.step = static_cast<uint64_t>(megabytes);
  if (transport.send("server", hello, timeout) != SendStatus::kSent)
    CAIRN_THROW(PeerLost, "probe server ", target, " did not accept a connection within ",
                timeout.count(), " s (is `provider --probe-serve` running there?)");
  Message chunk;
  chunk.kind = MessageKind::kActivation;
  chunk.job_id = kProbeJob;
  chunk.tensors = {{"x", torch::rand({256 * 1024})}};  // 1 MiB
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < megabytes; ++i)
    if (transport.send("server", chunk, timeout) != SendStatus::kSent)
      CAIRN_THROW(PeerLost, "probe server ", target, " stopped taking data");
  auto ack = transport.receive(timeout);
  if (!ack || ack->step != static_cast<uint64_t>(megabytes))
    CAIRN_THROW(PeerLost, "probe server ", target, " did not acknowledge within ", timeout.count(), " s");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return megabytes * 1024.0 * 1024.0 * 8.0 / s / 1e6;
}

}  // namespace

double probeBandwidthMbps(const std::optional<std::string>& peer, int megabytes,
                          std::chrono::seconds timeout) {
  std::thread server;
  std::string target = peer.value_or("");
  if (!peer) server = startLoopbackServer(timeout, &target);
  double mbps = 0;
  std::exception_ptr failure;
  try {
    mbps = timeTransfer(target, megabytes, timeout);
  } catch (...) {
    failure = std::current_exception();
  }
  if (server.joinable()) server.join();
  if (failure) std::rethrow_exception(failure);
  return mbps;
}

nlohmann::json nodeConfigEntry(const MachineProbe& p, const std::string& address) {
  auto round2 = [](double x) { return std::round(x * 100) / 100; };
  nlohmann::json entry = {{"IP", address},
                          {"benchmarks",
                           {{"ram", round2(p.ram_gb)},
                            {"bandwidth", round2(p.bandwidth_mbps)},
                            {"compute", round2(p.compute_gflops)},
                            {"cores", p.cores}}}};
  if (!p.gpus.empty()) entry["benchmarks"]["gpus"] = gpuFiguresToJson(p.gpus);
  return entry;
}

std::string probeSummary(const MachineProbe& p, const std::string& gpus_none_reason) {
  char line[512];
  std::snprintf(line, sizeof line, "CPU: %d cores, %.1f GB RAM, %.1f GFLOPS (float32 matmul); "
                "network %.1f Mbps (%s)\n", p.cores, p.ram_gb, p.compute_gflops, p.bandwidth_mbps,
                p.bandwidth_peer.empty() ? "loopback" : p.bandwidth_peer.c_str());
  std::string out = line;
  if (p.gpus.empty()) return out + "GPUs: none (" + gpus_none_reason + ")\n";
  for (size_t i = 0; i < p.gpus.size(); ++i) {
    const GpuFigures& g = p.gpus[i];
    std::snprintf(line, sizeof line, "GPU %zu: %s, %.1f GB; dense TFLOP/s fp32 %.1f, bf16 %.1f; "
                  "pinned copies GB/s host->device %.1f, device->host %.1f\n", i, g.name.c_str(),
                  g.memory_gb, g.fp32_tflops, g.bf16_tflops, g.h2d_gb_per_s, g.d2h_gb_per_s);
    out += line;
  }
  return out;
}

}  // namespace cairn
