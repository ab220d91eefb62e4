#include "node/volunteer/VolunteerWorkdir.h"

#include <filesystem>
#include <fstream>

#include "core/JsonReader.h"
#include "core/Log.h"
#include "trainer/Checkpoint.h"

namespace cairn {
namespace fs = std::filesystem;

namespace {

void writeBytes(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) CAIRN_THROW(BadInput, tmp, ": cannot write ", bytes.size(), " bytes");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) CAIRN_THROW(BadInput, path, ": cannot move the new file into place: ", ec.message());
}

// The valid checkpoint steps of the assignment already in `node_data` when it is the same stage as
// `a` (same job, name, cluster and stage); empty otherwise (or when none is valid).
std::vector<int64_t> sameStageCheckpoints(const std::string& node_data, const CheckedAssignment& a) {
  try {
    std::error_code ec;
    if (!fs::exists(nodeSpecPath(node_data, a.node.name), ec)) return {};
    const NodeSpec old = readNodeSpec(nodeSpecPath(node_data, a.node.name));
    const JobSpec old_job = readJobSpec(jobSpecPath(node_data));
    if (old_job.job_id != a.job.job_id || old.name != a.node.name ||
        old.cluster != a.node.cluster || old.stage != a.node.stage ||
        old.num_stages != a.node.num_stages)
      return {};
    return validCheckpointSteps(nodeDirectory(node_data, a.node.name) + "/checkpoints");
  } catch (const Error& e) {
    CAIRN_INFO("the earlier assignment in ", node_data, " is not this one (", e.what(), ")");
    return {};
  }
}

}  // namespace

VolunteerWorkdir::VolunteerWorkdir(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  fs::create_directories(path_, ec);
  if (ec || !fs::is_directory(path_))
    CAIRN_THROW(BadInput, "--workdir ", path_, ": cannot create the folder",
                ec ? ": " + ec.message() : std::string());
}

CurveKeyPair VolunteerWorkdir::loadOrCreateIdentity(bool* created) const {
  const std::string file = identityPath();
  std::error_code ec;
  const bool exists = fs::exists(file, ec);
  if (created) *created = !exists;
  if (exists) return readKeyFile(file);
  const CurveKeyPair keys = generateCurveKeyPair();
  writeKeyFile(file, keys);
  return keys;
}

std::optional<Membership> VolunteerWorkdir::readMembership() const {
  const std::string file = membershipPath();
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  const nlohmann::json document = readJsonFile(file);
  if (!document.is_object()) CAIRN_THROW(BadInput, file, ": must be a JSON object");
  JsonReader in(document, file);
  in.rejectUnknownKeys({"format", "coordinator", "coordinator_key", "name"});
  if (in.integer("format", 1, 1) != 1) in.fail("format", "must be 1");
  Membership m;
  m.coordinator = in.string("coordinator");
  m.coordinator_key = in.string("coordinator_key");
  if (!isZ85Key(m.coordinator_key)) in.fail("coordinator_key", "must be a 40-character Z85 key");
  m.name = in.string("name");
  if (m.name.empty() || m.name.size() > 128) in.fail("name", "must be 1 to 128 characters");
  return m;
}

void VolunteerWorkdir::writeMembership(const Membership& m) const {
  writeJsonFile(membershipPath(), {{"format", 1},
                                   {"coordinator", m.coordinator},
                                   {"coordinator_key", m.coordinator_key},
                                   {"name", m.name}});
}

WrittenAssignment VolunteerWorkdir::writeAssignment(const CheckedAssignment& a,
                                                    const CurveKeyPair& identity) const {
  const std::string node_data = nodeDataPath();
  WrittenAssignment out;
  out.node_data = node_data;
  out.checkpoint_steps = sameStageCheckpoints(node_data, a);
  out.resume = !out.checkpoint_steps.empty();
  std::error_code ec;
  if (out.resume) {
    CAIRN_INFO("the same stage as before, with checkpoints up to step ", out.checkpoint_steps.back(),
               " in ", nodeDirectory(node_data, a.node.name), "/checkpoints: resuming from them");
  } else if (fs::exists(node_data, ec)) {
    const std::string previous = path_ + "/node_data.previous";
    fs::remove_all(previous, ec);
    fs::rename(node_data, previous, ec);
    if (ec)
      CAIRN_THROW(BadInput, node_data, ": cannot move an earlier assignment aside to ", previous,
                  ": ", ec.message());
    CAIRN_INFO("the earlier assignment's folder is now ", previous);
  }
  const std::string dir = nodeDirectory(node_data, a.node.name);
  fs::create_directories(dir, ec);
  if (ec) CAIRN_THROW(BadInput, dir, ": cannot create the folder: ", ec.message());
  writeJsonFile(jobSpecPath(node_data), toJson(a.job));
  writeKeyFile(dir + "/" + kSecretKeyFile, identity);
  writeBytes(dir + "/" + a.node.stage_file, a.stage);
  writeJsonFile(nodeSpecPath(node_data, a.node.name), toJson(a.node));
  if (a.checkpoint) {
    const std::string checkpoints = dir + "/checkpoints";
    fs::create_directories(checkpoints, ec);
    const std::string file = checkpointPath(checkpoints, a.checkpoint_step);
    writeBytes(file, *a.checkpoint);
    try {
      readCheckpoint(checkpoints, a.checkpoint_step);
    } catch (const Error& e) {
      fs::remove(file, ec);
      CAIRN_THROW(BadInput, "the coordinator's checkpoint of step ", a.checkpoint_step, " for ",
                  a.node.name, " does not verify: ", e.what());
    }
    out.checkpoint_steps = validCheckpointSteps(checkpoints);
    out.resume = true;
    CAIRN_INFO("taking ", a.node.name, " over from the coordinator's checkpoint of step ",
               a.checkpoint_step, " (", a.checkpoint->size(), " bytes, written to ", file, ")");
  }
  return out;
}

}  // namespace cairn
