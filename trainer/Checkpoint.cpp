#include "trainer/Checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <regex>

#include "core/Error.h"
#include "core/Log.h"
#include "core/Safetensors.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

// The checkpoint is a safetensors file (core/Safetensors.h); its "__metadata__" holds
//   "cairn_checkpoint": the JSON meta (with "step"), as text
//   "checksum":         CRC-32 (zlib) of the meta text and of every tensor's name, dtype, shape and
//                       bytes, in file order, as 8 hex digits
// The safetensors reader already rejects truncated files and broken headers; the checksum catches
// flipped bits in the data and in the values of the header.
constexpr const char* kMetaKey = "cairn_checkpoint";
constexpr const char* kChecksumKey = "checksum";
constexpr const char* kFormat = "cairn-checkpoint-1";

class Crc {
 public:
  void add(const void* data, size_t size) {
    const auto* bytes = static_cast<const Bytef*>(data);
    while (size > 0) {  // crc32 takes a uInt length
      const uInt chunk = uInt(std::min<size_t>(size, 1u << 30));
      value_ = crc32(value_, bytes, chunk);
      bytes += chunk;
      size -= chunk;
    }
  }
  void add(const std::string& s) {
    add(s.data(), s.size());
    add("\0", 1);  // separator: "ab","c" differs from "a","bc"
  }
  std::string hex() const {
    char buffer[16];
    std::snprintf(buffer, sizeof buffer, "%08lx", static_cast<unsigned long>(value_));
    return buffer;
  }

 private:
  uLong value_ = crc32(0L, Z_NULL, 0);
};

std::string checksumOf(const std::string& meta_text,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  Crc crc;
  crc.add(meta_text);
  for (const auto& [name, tensor] : tensors) {
    torch::Tensor t = tensor.detach().cpu().contiguous();
    crc.add(name);
    crc.add(safetensorsDtypeName(t.scalar_type()));
    for (int64_t d : t.sizes()) crc.add(&d, sizeof d);
    crc.add(t.data_ptr(), size_t(t.numel()) * t.element_size());
  }
  return crc.hex();
}

// fsync a file or a folder; `what` names it in the error.
void syncPath(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) CAIRN_THROW(BadInput, path, ": cannot open to fsync: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) CAIRN_THROW(BadInput, path, ": fsync failed: ", std::strerror(saved));
}

// The step of a file named step_<N>.ckpt, or -1.
int64_t stepOfName(const std::string& name) {
  static const std::regex pattern("step_([0-9]{1,18})\\.ckpt");
  std::smatch m;
  if (!std::regex_match(name, m, pattern)) return -1;
  return std::stoll(m[1].str());
}

// Steps of the files named step_<N>.ckpt in dir (unverified), ascending.
std::vector<int64_t> namedSteps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return steps;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const int64_t s = stepOfName(entry.path().filename().string());
    if (s >= 0) steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

std::vector<int64_t> removeCheckpointsAfter(const std::string& dir, int64_t step) {
  std::vector<int64_t> removed;
  std::error_code ec;
  for (int64_t s : namedSteps(dir))
    if (s > step && fs::remove(checkpointPath(dir, s), ec)) removed.push_back(s);
  return removed;
}

std::string checkpointPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / ("step_" + std::to_string(step) + ".ckpt")).string();
}

void writeCheckpoint(const std::string& dir, const CheckpointData& data, int64_t keep,
                     int64_t keep_from) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) CAIRN_THROW(BadInput, dir, ": cannot create the checkpoint folder: ", ec.message());
  nlohmann::json meta = data.meta;
  meta["step"] = data.step;
  meta["format"] = kFormat;
  const std::string meta_text = meta.dump();
  const std::string path = checkpointPath(dir, data.step);
  const std::string temporary = path + ".tmp";
  // writeSafetensors itself writes `temporary`.tmp and renames it to `temporary`; we then fsync
  // that file, rename it into place and fsync the folder, so a crash leaves either the old set of
  // checkpoints or the new one complete, never a half-written step_<N>.ckpt.
  writeSafetensors(temporary, data.tensors,
                   {{kMetaKey, meta_text}, {kChecksumKey, checksumOf(meta_text, data.tensors)}});
  syncPath(temporary, false);
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    CAIRN_THROW(BadInput, path, ": cannot rename ", temporary, " into place: ",
                std::strerror(errno));
  syncPath(dir, true);

  // Checkpoints of later steps belong to a run that was resumed from an earlier one: this one
  // supersedes them. Then keep the newest `keep` (by step) and those from `keep_from` on, delete
  // the rest and any temporary files left by a crash.
  removeCheckpointsAfter(dir, data.step);
  std::vector<int64_t> steps = namedSteps(dir);
  if (keep > 0 && int64_t(steps.size()) > keep)
    for (size_t i = 0; i + size_t(keep) < steps.size(); ++i)
      if (keep_from < 0 || steps[i] < keep_from) fs::remove(checkpointPath(dir, steps[i]), ec);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
        name.rfind("step_", 0) == 0 && entry.path().string() != temporary)
      fs::remove(entry.path(), ec);
  }
}

CheckpointData readCheckpoint(const std::string& dir, int64_t step) {
  const std::string path = checkpointPath(dir, step);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    CAIRN_THROW(BadInput, path, ": no such checkpoint (expected a file written by "
                "writeCheckpoint for step ", step, ")");
  // Both calls validate the whole safetensors structure (truncation, bad header) first.
  const auto metadata = readSafetensorsMetadata(path);
  auto meta_it = metadata.find(kMetaKey);
  auto sum_it = metadata.find(kChecksumKey);
  if (meta_it == metadata.end() || sum_it == metadata.end())
    CAIRN_THROW(BadInput, path, ": not a cairn checkpoint (its __metadata__ lacks \"", kMetaKey,
                "\" or \"", kChecksumKey, "\")");
  CheckpointData data;
  data.tensors = readSafetensors(path);
  const std::string actual = checksumOf(meta_it->second, data.tensors);
  if (actual != sum_it->second)
    CAIRN_THROW(BadInput, path, ": checksum mismatch (file says ", sum_it->second,
                ", contents give ", actual, "): the checkpoint is corrupt");
  data.meta = nlohmann::json::parse(meta_it->second, nullptr, false);
  if (data.meta.is_discarded() || !data.meta.is_object() || !data.meta.contains("step") ||
      !data.meta["step"].is_number_integer() || data.meta.value("format", "") != kFormat)
    CAIRN_THROW(BadInput, path, ": checkpoint meta is not a JSON object with \"step\" and format \"",
                kFormat, "\"");
  data.step = data.meta["step"].get<int64_t>();
  if (data.step != step)
    CAIRN_THROW(BadInput, path, ": holds step ", data.step, " but is named for step ", step);
  return data;
}

const std::string& thisProcessAsWriter() {
  static const std::string writer = [] {
    std::random_device device;
    const uint64_t n = (uint64_t(device()) << 32) ^ uint64_t(device());
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(n));
    return std::string(text);
  }();
  return writer;
}

std::vector<int64_t> validCheckpointSteps(const std::string& dir) {
  std::vector<int64_t> valid;
  for (int64_t s : namedSteps(dir)) {
    try {
      readCheckpoint(dir, s);
      valid.push_back(s);
    } catch (const Error& e) {
      CAIRN_WARN("skipping checkpoint ", checkpointPath(dir, s), ": ", e.what());
    }
  }
  return valid;
}

namespace {

// Copies the checkpoint's "stage.<name>" into `target` (same shape and dtype) and takes it out
// of `by_name`.
void restoreStageTensor(const std::string& name, torch::Tensor target, std::map<std::string, torch::Tensor>* by_name,
                        const std::string& path) {
  auto it = by_name->find("stage." + name);
  if (it == by_name->end()) CAIRN_THROW(BadInput, path, ": lacks stage tensor \"", name, "\"");
  if (it->second.sizes() != target.sizes() || it->second.scalar_type() != target.scalar_type())
    CAIRN_THROW(BadInput, path, ": stage tensor \"", name, "\" is ",
                c10::toString(it->second.scalar_type()), " ", it->second.sizes(),
                "; the stage has ", c10::toString(target.scalar_type()), " ", target.sizes());
  target.copy_(it->second);
  by_name->erase(it);
}

}  // namespace

void restoreStageWeights(torch::jit::Module& module, std::map<std::string, torch::Tensor>* by_name,
                         const std::string& path) {
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : module.named_parameters(/*recurse=*/true))
      restoreStageTensor(p.name, p.value, by_name, path);
    for (const auto& b : module.named_buffers(/*recurse=*/true))
      restoreStageTensor(b.name, b.value, by_name, path);
  }
  for (const auto& [name, t] : *by_name)
    if (name.rfind("stage.", 0) == 0)
      CAIRN_THROW(BadInput, path, ": stage tensor \"", name.substr(6),
                  "\" is not in this node's stage");
}


void loadStageWeights(torch::jit::Module& stage, const CheckpointData& data, const std::string& source) {
  std::map<std::string, torch::Tensor> by_name(data.tensors.begin(), data.tensors.end());
  restoreStageWeights(stage, &by_name, source);
}

}  // namespace cairn
