// Files that travel INSIDE job.json. A provider has job.json, its node.json and its stage.pt, and
// nothing else: a volunteer of `clusterize --serve` receives exactly those three. A file job.json
// names (a TorchScript loss, "loss_fn": {"torchscript": "loss.pt"}) would be missing there, so
// clusterize embeds it when it writes node_data/job.json:
//   {"torchscript": "loss.pt"}  ->  {"torchscript": "loss.pt", "torchscript_base64": "<file>"}
// The trainer (trainer/TrainOptions.cpp) loads the embedded bytes when present, and the file
// (relative to job.json's folder) otherwise. Thread-safety: free functions.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace cairn {

// RFC 4648 base64 with padding. decodeBase64 gives nullopt for anything else (bad characters,
// length, padding).
std::string encodeBase64(const std::string& bytes);
std::optional<std::string> decodeBase64(const std::string& text);

// The largest file embedded in job.json (job.json travels in one coordination message header).
constexpr size_t kMaxEmbeddedFileBytes = 512 * 1024;

// If training_definition.loss_fn is {"torchscript": FILE} without "torchscript_base64", reads FILE
// (relative to the folder of `job_path`, the job.json it came from, or absolute) and adds its
// bytes. BadInput naming `job_path`, the key and the file when it is missing, unreadable or larger
// than kMaxEmbeddedFileBytes. Returns whether it embedded a file.
bool embedJobFiles(nlohmann::json* training_definition, const std::string& job_path);

}  // namespace cairn
