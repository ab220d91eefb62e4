#include "node/protocol/VolunteerProbeCodec.h"

#include <cstdio>
#include <exception>

#include "node/protocol/CoordinationFields.h"

namespace cairn {

nlohmann::json encodeVolunteerProbe(const VolunteerProbe& p) {
  return {{"ram_gb", p.ram_gb},
          {"cores", p.cores},
          {"compute_gflops", p.compute_gflops},
          {"bandwidth_mbps", p.bandwidth_mbps},
          {"gpus", gpuFiguresToJson(p.gpus)},
          {"libtorch", p.libtorch}};
}

bool decodeVolunteerProbe(const nlohmann::json& probe, VolunteerProbe* out, std::string* why) {
  coordination_detail::Fields p(probe, "join: probe", why);
  VolunteerProbe m;
  m.ram_gb = p.number("ram_gb");
  m.cores = p.integer("cores", 0, 1 << 20);
  m.compute_gflops = p.number("compute_gflops");
  m.bandwidth_mbps = p.number("bandwidth_mbps");
  if (p.ok() && probe.contains("libtorch")) {
    m.libtorch = p.string("libtorch", kMaxLibtorchVersionBytes);
    if (p.ok() && !parseLibtorchVersion(m.libtorch))
      p.fail("libtorch", "a libtorch version major.minor.patch, digits only (e.g. \"2.11.0\")");
  }
  if (p.ok() && probe.contains("gpus")) {
    try {
      m.gpus = parseGpuFigures(probe["gpus"], "join: probe: gpus");
    } catch (const std::exception& e) {  // BadInput naming the GPU, the key and the bound
      p.failWith(e.what());
    }
  }
  if (!p.ok()) return false;
  *out = std::move(m);
  return true;
}

std::string describeGpus(const std::vector<GpuFigures>& gpus) {
  if (gpus.empty()) return "none";
  std::string out;
  for (const GpuFigures& g : gpus) {
    char figures[160];
    std::snprintf(figures, sizeof figures,
                  " (%.1f GB, %.1f fp32 / %.1f bf16 TFLOP/s, %.1f/%.1f GB/s h2d/d2h)", g.memory_gb,
                  g.fp32_tflops, g.bf16_tflops, g.h2d_gb_per_s, g.d2h_gb_per_s);
    out += (out.empty() ? "" : "; ") + g.name + figures;
  }
  return out;
}

}  // namespace cairn
