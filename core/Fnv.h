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

// FNV-1a's step over 8-byte words (the tail byte by byte): one multiply per 8 bytes instead of
// one per byte, for hashing tensors at every sync (RingBuckets::resultChecksum). Not the standard
// FNV-1a of the bytes.
inline uint64_t fnv1aWords(uint64_t hash, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    __builtin_memcpy(&word, p + i, 8);
    hash ^= word;
    hash *= 1099511628211ull;
  }
  return fnv1a(hash, p + i, bytes - i);
}

inline uint64_t fnv1a64(const std::string& bytes) { return fnv1a(kFnvOffset, bytes.data(), bytes.size()); }

}  // namespace cairn
