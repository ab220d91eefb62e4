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

// The five decoders a peer reaches besides the wire codec (docs/PROTOCOL.md), one target each.
// Input: frames in wireDecoder's layout. Every decoder must return a value or say why (never both,
// never neither, never throw), and what it accepts must encode and decode again to the same bytes
// (encode(decode(m)) is a fixed point), so nothing a peer sends is half-understood.
//   coordination      a coordination message (frames): what the coordinator decodes from a
//                     volunteer (join, heartbeat, metrics batches, uploads, leaving…), what a
//                     volunteer decodes from the coordinator, the reachability check
//   chunks            a chunk request (the coordinator's ChunkServer) and a chunk reply (a
//                     volunteer's ChunkFetcher)
// The others read a pipeline-wire message: the frames go through the wire decoder first (the
// way they arrive), and a message it accepts goes to
//   pipelineControl   hello, leaving, ckpt_steps, resume_at (pipeline neighbours)
//   ringJoin          a ring's join request and welcome (ring peers in other clusters)
//   collectiveNotices a process group's abort, keep-alive and leave notices
void coordination(const uint8_t* data, size_t size);
void chunks(const uint8_t* data, size_t size);
void pipelineControl(const uint8_t* data, size_t size);
void ringJoin(const uint8_t* data, size_t size);
void collectiveNotices(const uint8_t* data, size_t size);
// wireDecoder's layout → frames (the inverse of packFrames).
std::vector<std::string> unpackFrames(const uint8_t* data, size_t size);

// Input: a JSON document (any bytes). Parsed as node.json, job.json and node_configs.json; each
// must either succeed or throw cairn::BadInput with a message.
void nodeData(const uint8_t* data, size_t size);

}  // namespace cairn::fuzz
