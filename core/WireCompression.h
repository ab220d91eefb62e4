// Pure codecs for compressing fp32 tensors on the wire (issue [I] part 5): bf16, fp16 and int8
// with one fp32 scale per row. Torch-free and header-only so every room can use them. Used by the
// stage link (activations bf16/fp16) and the ring all-reduce (wire.sync bf16, and int8 in blocks:
// encodeInt8Blocks below); docs/PROTOCOL.md "Compressed tensors".
//
// Rounding (all exact, no platform dependence):
//   bf16: the upper 16 bits of the fp32, round-to-nearest-even; NaN -> 0x7FC0 (as torch).
//   fp16: IEEE binary16, round-to-nearest-even incl. subnormals, overflow -> inf (as torch).
//   int8: a tensor flattened to [rows, cols]; per row scale = max|x| / 127 (fp32), q =
//         nearbyint(x / scale) (round-half-even) clamped to [-127, 127], decoded q * scale; an
//         all-zero row has scale 0 and q 0. -128 is never produced and rejected on decode.
//         Non-finite inputs are rejected (int8 cannot carry them).
// Encoded int8 layout: rows fp32 scales (little-endian), then rows*cols int8 values, row major.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace cairn::wire {

inline uint32_t floatBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bitsFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t toBf16(float f) {
  uint32_t u = floatBits(f);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float fromBf16(uint16_t h) { return bitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t toFp16(float f) {
  const float scaleToInf = 0x1.0p+112f;
  const float scaleToZero = 0x1.0p-110f;
  float base = (std::fabs(f) * scaleToInf) * scaleToZero;
  const uint32_t w = floatBits(f);
  const uint32_t shl1 = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1 & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bitsFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = floatBits(base);
  const uint32_t expBits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantBits = bits & 0x00000FFFu;
  const uint32_t nonsign = expBits + mantBits;
  return static_cast<uint16_t>((sign >> 16) | (shl1 > 0xFF000000u ? 0x7E00u : nonsign));
}
inline float fromFp16(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  float mag;
  if (exp == 0) mag = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) mag = mant ? bitsFloat(0x7FC00000u) : bitsFloat(0x7F800000u);
  else return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  return bitsFloat(floatBits(mag) | sign);
}

// int8 with per-row scales. Throws std::invalid_argument with a message on bad input.
inline std::vector<uint8_t> encodeInt8Rows(const float* x, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw std::invalid_argument("int8 encode: negative shape");
  std::vector<uint8_t> out(static_cast<size_t>(rows) * 4 + static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float maxAbs = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(row[c]))
        throw std::invalid_argument("int8 encode: non-finite value in row " + std::to_string(r));
      maxAbs = std::fmax(maxAbs, std::fabs(row[c]));
    }
    const float scale = maxAbs / 127.0f;
    std::memcpy(out.data() + r * 4, &scale, 4);
    int8_t* q = reinterpret_cast<int8_t*>(out.data() + rows * 4 + r * cols);
    for (int64_t c = 0; c < cols; ++c) {
      float v = scale == 0.0f ? 0.0f : std::nearbyint(row[c] / scale);
      v = std::fmin(127.0f, std::fmax(-127.0f, v));
      q[c] = static_cast<int8_t>(v);
    }
  }
  return out;
}

inline std::vector<float> decodeInt8Rows(const uint8_t* bytes, size_t size, int64_t rows,
                                         int64_t cols) {
  if (rows < 0 || cols < 0 || (cols != 0 && rows > INT64_MAX / 2 / cols))
    throw std::invalid_argument("int8 decode: bad shape");
  const size_t want = static_cast<size_t>(rows) * 4 + static_cast<size_t>(rows * cols);
  if (size != want)
    throw std::invalid_argument("int8 decode: " + std::to_string(size) + " bytes, expected " +
                                std::to_string(want) + " for [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]");
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    float scale;
    std::memcpy(&scale, bytes + r * 4, 4);
    if (!std::isfinite(scale) || scale < 0.0f)
      throw std::invalid_argument("int8 decode: bad scale in row " + std::to_string(r));
    const int8_t* q = reinterpret_cast<const int8_t*>(bytes + rows * 4 + r * cols);
    for (int64_t c = 0; c < cols; ++c) {
      if (q[c] == -128) throw std::invalid_argument("int8 decode: value -128 in row " +
                                                     std::to_string(r));
      out[static_cast<size_t>(r * cols + c)] = static_cast<float>(q[c]) * scale;
    }
  }
  return out;
}

// int8 in blocks of a 1-d run of `n` values (ring all-reduce chunks,
// node/collectives/ProcessGroupAllReduce.cpp): block b covers [b*block, min(n, (b+1)*block)) —
// the last one may be shorter — with its own scale, rounded exactly as encodeInt8Rows.
// Layout: ceil(n/block) fp32 scales, then n int8.
inline int64_t int8BlockCount(int64_t n, int64_t block) { return (n + block - 1) / block; }
inline int64_t int8BlocksBytes(int64_t n, int64_t block) {
  return int8BlockCount(n, block) * 4 + n;
}
// `out` holds int8BlocksBytes(n, block) bytes. Throws std::invalid_argument for a non-finite value.
inline void encodeInt8Blocks(const float* x, int64_t n, int64_t block, uint8_t* out) {
  if (n < 0 || block <= 0) throw std::invalid_argument("int8 encode: bad shape");
  const int64_t blocks = int8BlockCount(n, block);
  int8_t* q = reinterpret_cast<int8_t*>(out + blocks * 4);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * block, end = std::min(n, begin + block);
    float maxAbs = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(x[i]))
        throw std::invalid_argument("int8 encode: non-finite value at element " +
                                    std::to_string(i));
      maxAbs = std::fmax(maxAbs, std::fabs(x[i]));
    }
    const float scale = maxAbs / 127.0f;
    std::memcpy(out + b * 4, &scale, 4);
    for (int64_t i = begin; i < end; ++i) {
      float v = scale == 0.0f ? 0.0f : std::nearbyint(x[i] / scale);
      v = std::fmin(127.0f, std::fmax(-127.0f, v));
      q[i] = static_cast<int8_t>(v);
    }
  }
}
// "" when `bytes` (size int8BlocksBytes(n, block)) is a valid encoding, else what is wrong
// (a negative or non-finite scale, a value -128).
inline std::string checkInt8Blocks(const uint8_t* bytes, int64_t n, int64_t block) {
  const int64_t blocks = int8BlockCount(n, block);
  for (int64_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, bytes + b * 4, 4);
    if (!std::isfinite(scale) || scale < 0.0f)
      return "int8 block " + std::to_string(b) + " has scale " + std::to_string(scale);
  }
  const int8_t* q = reinterpret_cast<const int8_t*>(bytes + blocks * 4);
  for (int64_t i = 0; i < n; ++i)
    if (q[i] == -128) return "int8 value -128 at element " + std::to_string(i);
  return "";
}
// Decodes a valid encoding (checkInt8Blocks) into `out` (n floats): q * scale.
inline void decodeInt8Blocks(const uint8_t* bytes, int64_t n, int64_t block, float* out) {
  const int64_t blocks = int8BlockCount(n, block);
  const int8_t* q = reinterpret_cast<const int8_t*>(bytes + blocks * 4);
  for (int64_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, bytes + b * 4, 4);
    const int64_t begin = b * block, end = std::min(n, begin + block);
    for (int64_t i = begin; i < end; ++i) out[i] = static_cast<float>(q[i]) * scale;
  }
}

// training_definition.wire.activations on the stage link (trainer/Int8Boundary.h; docs/PROTOCOL.md
// "Compressed tensors"). A float32 boundary value of `shape` travels as: fp32 4 bytes a value,
// bf16/fp16 2; int8 (dim >= 2 only: fewer dimensions stay fp32) 1 byte a value plus a 4-byte
// scale per row, a row being the values of index 1 on for [B, F] and of index 2 on for
// [B, C, d2, ...] (one per sample and channel).
inline int64_t int8RowLength(const std::vector<int64_t>& shape) {
  int64_t cols = 1;
  for (size_t d = shape.size() == 2 ? 1 : 2; d < shape.size(); ++d) cols *= shape[d];
  return cols;
}
// Bytes of a float32 value of `shape` on the wire in `codec` ("fp32" | "bf16" | "fp16" | "int8").
inline int64_t float32WireBytes(const std::vector<int64_t>& shape, const std::string& codec) {
  int64_t values = 1;
  for (int64_t d : shape) values *= d;
  if (codec == "bf16" || codec == "fp16") return 2 * values;
  if (codec != "int8" || shape.size() < 2) return 4 * values;
  const int64_t cols = int8RowLength(shape);
  return cols == 0 ? 0 : values + 4 * (values / cols);
}

}  // namespace cairn::wire
