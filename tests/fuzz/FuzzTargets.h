// The bodies of cairn's fuzz targets, shared by the libFuzzer entry points (built with clang by
// tools/fuzz.sh) and by FuzzReplayTest (built with the normal toolchain), which replays the seed
// corpus and every crash input kept in tests/fuzz/regressions/ on every test run.
// A target returns normally for any input; a bug shows as an abort, a sanitizer report or an
// exception escaping (anything other than cairn::BadInput for documents).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cairn::fuzz {

// Input layout: byte 0 = frame count (1 + value % 8); then per frame a 4-byte little-endian
// length (clamped to what is left) and that many bytes; leftover bytes go to the last frame.
void wireDecoder(const uint8_t* data, size_t size);
// The inverse, for building seeds: frames → fuzz input.
std::vector<uint8_t> packFrames(const std::vector<std::string>& frames);

// Input: a JSON document (any bytes). Parsed as node.json, job.json and node_configs.json; each
// must either succeed or throw cairn::BadInput with a message.
void nodeData(const uint8_t* data, size_t size);

}  // namespace cairn::fuzz
