#include "clusterize/NodeDataWriter.h"

#include <filesystem>
#include <set>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/LibtorchVersion.h"
#include "core/Log.h"
#include "core/TorchCompat.h"

namespace cairn::clusterize {

namespace fs = std::filesystem;

std::vector<std::string> NodeDataWriter::write(
    const PartitionPlan& plan, const JobSpec& job, const std::vector<NodeSpec>& planned_nodes,
    const std::map<std::string, torch::jit::Module>& stages) const {
  // One CURVE key pair per node: the public keys go into the node.json of everyone who talks to
  // that node, the secret only into the node's own folder (mode 0600).
  std::vector<NodeSpec> nodes = planned_nodes;
  std::map<std::string, CurveKeyPair> keys;
  if (generate_keys_) keys = assignCurveKeys(nodes);
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec) CAIRN_THROW(BadInput, folder_, ": cannot create the output folder: ", ec.message());
  const fs::path root(folder_);

  std::set<std::string> previous;
  const fs::path manifest = root / kManifest;
  if (fs::exists(manifest)) {
    try {
      const nlohmann::json list = readJsonFile(manifest.string());
      for (const auto& entry : list.at("files")) previous.insert(entry.get<std::string>());
    } catch (const std::exception& e) {
      CAIRN_WARN("clusterize: ", manifest.string(), " is unreadable (", e.what(),
                 "); files of the previous run will not be cleaned up");
    }
  }

  std::vector<std::string> written;
  nlohmann::json plan_json = toJson(plan);
  plan_json["libtorch"] = libtorchVersion();  // the stage files below are saved by this libtorch
  writeJsonFile((root / "plan.json").string(), plan_json);
  written.push_back("plan.json");
  // Validate what we write with the reader the providers use.
  parseJobSpec(toJson(job), "job.json");
  writeJsonFile((root / "job.json").string(), toJson(job));
  written.push_back("job.json");
  for (const NodeSpec& node : nodes) {
    const std::string relative = "nodes/" + node.name;
    fs::create_directories(root / relative, ec);
    if (ec) CAIRN_THROW(BadInput, (root / relative).string(), ": cannot create: ", ec.message());
    parseNodeSpec(toJson(node), relative + "/node.json");
    writeJsonFile((root / relative / "node.json").string(), toJson(node));
    written.push_back(relative + "/node.json");
    if (generate_keys_) {
      writeKeyFile((root / relative / kSecretKeyFile).string(), keys.at(node.name));
      written.push_back(relative + "/" + kSecretKeyFile);
    }
    const fs::path stage_path = root / relative / node.stage_file;
    const fs::path temporary = stage_path.string() + ".tmp";
    stages.at(node.name).save(temporary.string());
    fs::rename(temporary, stage_path, ec);
    if (ec) CAIRN_THROW(BadInput, stage_path.string(), ": cannot write: ", ec.message());
    written.push_back(relative + "/" + node.stage_file);
  }

  const std::set<std::string> now(written.begin(), written.end());
  for (const auto& old : previous) {
    if (now.count(old) || old.find("..") != std::string::npos || old.empty() || old[0] == '/') continue;
    fs::remove(root / old, ec);
    const fs::path parent = (root / old).parent_path();
    if (fs::is_directory(parent) && fs::is_empty(parent)) fs::remove(parent, ec);
  }
  writeJsonFile(manifest.string(), {{"written_by", "clusterize"}, {"files", written}});
  return written;
}

std::optional<std::string> NodeDataWriter::stageFilesLibtorch(const std::string& folder) {
  const std::string path = planPath(folder);
  if (!fs::exists(path)) return std::nullopt;
  const nlohmann::json plan = readJsonFile(path);
  if (!plan.is_object()) CAIRN_THROW(BadInput, path, ": not a JSON object");
  const JsonReader reader(plan, path);
  const std::string version = reader.stringOr("libtorch", kUnrecordedLibtorchVersion);
  if (!parseLibtorchVersion(version))
    reader.fail("libtorch", "must be the libtorch version that wrote the stage files, "
                            "major.minor.patch (e.g. \"2.11.0\"), not " + inQuotes(version.substr(0, 64)));
  return version;
}

}  // namespace cairn::clusterize
