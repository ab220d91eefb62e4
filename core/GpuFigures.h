// What a volunteer's GPU is, as `provider --probe` measures it and as node_configs.json, the join
// request and the coordinator carry it (one shared vocabulary so the three agree):
//   "gpus": [ { "name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.1,
//               "fp32_tflops": 51.0, "bf16_tflops": 600.0,
//               "h2d_gb_per_s": 25.0, "d2h_gb_per_s": 24.0 }, ... ]
// memory_gb: the device's total memory (GB = 1e9 bytes); *_tflops: measured dense matmul
// throughput; h2d/d2h: measured pinned host<->device copy bandwidth in gigabytes per second.
// Every figure must be positive and below a plausible bound (kMax* below): a figure above it is
// a broken or lying probe, and is refused with a sentence naming the key and the bound.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cairn {

struct GpuFigures {
  std::string name;
  double memory_gb = 0;
  double fp32_tflops = 0;
  double bf16_tflops = 0;
  double h2d_gb_per_s = 0;
  double d2h_gb_per_s = 0;
};

// Plausible bounds (2026: an H200 has 141 GB, a B300 or an MI355X 288 GB; a B200 ~2,250 dense
// bf16 TFLOP/s on paper and far less measured; PCIe 6 x16 moves ~120 GB/s, NVLink-C2C 450 GB/s each way).
inline constexpr double kMaxGpuMemoryGb = 400;
inline constexpr double kMaxGpuFp32Tflops = 1000;
inline constexpr double kMaxGpuBf16Tflops = 2000;
inline constexpr double kMaxGpuCopyGbPerS = 1000;
inline constexpr size_t kMaxGpuNameBytes = 256;
inline constexpr size_t kMaxGpusPerNode = 64;

// Parses the "gpus" array (validated as above); `context` prefixes every error, e.g.
// "node_configs.json: node \"3\": benchmarks.gpus". Throws BadInput.
std::vector<GpuFigures> parseGpuFigures(const nlohmann::json& gpus, const std::string& context);
nlohmann::json gpuFiguresToJson(const std::vector<GpuFigures>& gpus);

}  // namespace cairn
