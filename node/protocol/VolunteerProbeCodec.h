// VolunteerProbe: what a volunteer reports about its machine when it joins (the `probe` object of
// Coordination.h's `join`, docs/PROTOCOL.md "Coordination"), with its one encode and its one
// validating decode:
//   probe {ram_gb, cores, compute_gflops, bandwidth_mbps,
//          gpus [{name, memory_gb, fp32_tflops, bf16_tflops, h2d_gb_per_s, d2h_gb_per_s}, …],
//          libtorch "2.11.0"}
// `gpus` has core/GpuFigures.h's schema and bounds (empty: no GPU); `libtorch` is the libtorch the
// volunteer was built against (core/LibtorchVersion.h). A join without them (a volunteer from
// before they existed) decodes as no GPU and libtorch 1.13.0. Whether the figures are acceptable
// beyond these bounds is the coordinator's business (coordinator/JoinPolicy.h).
// Ownership: plain values. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/GpuFigures.h"
#include "core/LibtorchVersion.h"

namespace cairn {

struct VolunteerProbe {
  double ram_gb = 0;
  int64_t cores = 0;
  double compute_gflops = 0;
  double bandwidth_mbps = 0;
  std::vector<GpuFigures> gpus;                   // empty: no GPU
  std::string libtorch = kUnrecordedLibtorchVersion;  // the volunteer's libtorchVersion()
};

nlohmann::json encodeVolunteerProbe(const VolunteerProbe& probe);

// Decodes the `probe` object of a `join`: false with `*why` set ("join: probe: …", naming the key)
// on anything malformed or out of bounds. Never throws.
bool decodeVolunteerProbe(const nlohmann::json& probe, VolunteerProbe* out, std::string* why);

// For logs and views: "none", or each GPU as "NVIDIA H100 80GB HBM3 (79.1 GB, 51.0 fp32 / 600.0
// bf16 TFLOP/s, 25.0/24.0 GB/s h2d/d2h)", joined by "; ".
std::string describeGpus(const std::vector<GpuFigures>& gpus);

}  // namespace cairn
