#include "core/GpuFigures.h"

#include "core/Error.h"
#include "core/JsonReader.h"

namespace cairn {

namespace {

double boundedFigure(const JsonReader& gpu, const std::string& key, double max,
                     const std::string& unit) {
  const double value = gpu.positiveNumber(key);
  if (value > max) {
    gpu.fail(key, "must be at most " + std::to_string(static_cast<long long>(max)) + " " + unit +
                      " (got " + std::to_string(value) + "): no GPU measures that much");
  }
  return value;
}

}  // namespace

std::vector<GpuFigures> parseGpuFigures(const nlohmann::json& gpus, const std::string& context) {
  if (!gpus.is_array()) {
    throw BadInput(context + " must be an array of GPU objects (got " + jsonTypeName(gpus) + ")");
  }
  if (gpus.size() > kMaxGpusPerNode) {
    throw BadInput(context + " lists " + std::to_string(gpus.size()) + " GPUs; at most " +
                   std::to_string(kMaxGpusPerNode) + " are accepted");
  }
  std::vector<GpuFigures> out;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const std::string where = context + "[" + std::to_string(i) + "]";
    if (!gpus[i].is_object()) {
      throw BadInput(where + " must be an object (got " + jsonTypeName(gpus[i]) + ")");
    }
    JsonReader gpu(gpus[i], where);
    gpu.rejectUnknownKeys(
        {"name", "memory_gb", "fp32_tflops", "bf16_tflops", "h2d_gb_per_s", "d2h_gb_per_s"});
    GpuFigures figures;
    figures.name = gpu.string("name");
    if (figures.name.empty() || figures.name.size() > kMaxGpuNameBytes) {
      gpu.fail("name", "must be 1 to " + std::to_string(kMaxGpuNameBytes) + " bytes");
    }
    figures.memory_gb = boundedFigure(gpu, "memory_gb", kMaxGpuMemoryGb, "GB");
    figures.fp32_tflops = boundedFigure(gpu, "fp32_tflops", kMaxGpuFp32Tflops, "TFLOP/s");
    figures.bf16_tflops = boundedFigure(gpu, "bf16_tflops", kMaxGpuBf16Tflops, "TFLOP/s");
    figures.h2d_gb_per_s = boundedFigure(gpu, "h2d_gb_per_s", kMaxGpuCopyGbPerS, "GB/s");
    figures.d2h_gb_per_s = boundedFigure(gpu, "d2h_gb_per_s", kMaxGpuCopyGbPerS, "GB/s");
    out.push_back(std::move(figures));
  }
  return out;
}

nlohmann::json gpuFiguresToJson(const std::vector<GpuFigures>& gpus) {
  nlohmann::json out = nlohmann::json::array();
  for (const GpuFigures& g : gpus) {
    out.push_back({{"name", g.name},
                   {"memory_gb", g.memory_gb},
                   {"fp32_tflops", g.fp32_tflops},
                   {"bf16_tflops", g.bf16_tflops},
                   {"h2d_gb_per_s", g.h2d_gb_per_s},
                   {"d2h_gb_per_s", g.d2h_gb_per_s}});
  }
  return out;
}

}  // namespace cairn
