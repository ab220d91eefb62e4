// Fnv: FNV-1a, 64-bit — the one checksum of the project's wire and files (ring tensors'
// identical-start check, checkpoint uploads, deal offer fingerprints). Hand-written: a few lines,
// and none of the project's libraries exposes a stable non-cryptographic hash.
// Header-only; no state; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cairn {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

// Continues `hash` over `bytes` bytes at `data` (start from kFnvOffset).
inline uint64_t fnv1a(uint64_t hash, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

inline uint64_t fnv1a64(const std::string& bytes) { return fnv1a(kFnvOffset, bytes.data(), bytes.size()); }

}  // namespace cairn
