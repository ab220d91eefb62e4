// Which libtorch wrote a plan's stage files and which one a volunteer runs, as "major.minor.patch"
// (core/TorchCompat.h's libtorchVersion() of the binary). Stage files written by libtorch 1.13
// load and train under 2.11 (checked on CPU and CUDA, issue [M]); the other direction is not
// checked, so a volunteer whose libtorch major.minor is older than the writer's is refused at
// join (coordinator/JoinPolicy.h). Torch-free, so the protocol decoder, clusterize's node_data and
// the coordinator share it. Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace cairn {

// What a plan or a join from before libtorch versions were recorded was written by: every cairn
// built until then compiled against Debian's libtorch 1.13.
inline constexpr const char* kUnrecordedLibtorchVersion = "1.13.0";
inline constexpr size_t kMaxLibtorchVersionBytes = 32;

struct LibtorchVersion {
  long major = 0, minor = 0, patch = 0;
};

// "2.11.0" → {2, 11, 0}; nullopt unless the text is digits.digits.digits (each 1 to 6 digits, at
// most kMaxLibtorchVersionBytes in all; no sign, suffix or whitespace).
std::optional<LibtorchVersion> parseLibtorchVersion(const std::string& text);

// Whether a volunteer running libtorch `reader` may be sent stage files written by libtorch
// `writer`: its major.minor is the writer's or newer (the patch level does not matter).
bool canLoadStageFiles(const LibtorchVersion& reader, const LibtorchVersion& writer);

// The refusal for a volunteer that cannot (empty when it can; "" also when either text is not a
// version, which the callers' own validation reports): e.g. "node_3's libtorch 1.13.0 cannot load
// stage files written by libtorch 2.11.0; install cairn built against libtorch ≥ 2.11".
std::string stageFilesProblem(const std::string& who, const std::string& reader,
                              const std::string& writer);

}  // namespace cairn
