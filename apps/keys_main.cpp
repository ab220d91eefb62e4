// cairn_keys: give an existing node_data folder (e.g. one written by hand or by an older
// clusterize) fresh CURVE keys: a secret.key (mode 0600) in each node folder and the public keys
// in every node.json, exactly as clusterize does for the plans it writes.
#include <CLI/CLI.hpp>
#include <filesystem>

#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/MainGuard.h"
#include "core/NodeData.h"

int main(int argc, char** argv) {
  CLI::App app{
      "cairn_keys: make one CURVE key pair per node of a node_data folder: write\n"
      "nodes/<name>/secret.key (mode 0600) and put the public keys into every node.json.\n"
      "Existing keys are replaced; restart every provider of the plan afterwards."};
  std::string node_data = "node_data";
  app.add_option("node_data", node_data, "folder written by clusterize")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("cairn_keys", [&] {
    namespace fs = std::filesystem;
    std::vector<cairn::NodeSpec> nodes;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(node_data + "/nodes", ec)) {
      const std::string spec = (entry.path() / "node.json").string();
      if (fs::exists(spec)) nodes.push_back(cairn::readNodeSpec(spec));
    }
    if (nodes.empty())
      CAIRN_THROW(BadInput, node_data, "/nodes: no node folders with a node.json (run clusterize)");
    const auto keys = cairn::assignCurveKeys(nodes);
    for (const cairn::NodeSpec& node : nodes) {
      const std::string dir = cairn::nodeDirectory(node_data, node.name);
      cairn::writeKeyFile(dir + "/" + cairn::kSecretKeyFile, keys.at(node.name));
      cairn::writeJsonFile(cairn::nodeSpecPath(node_data, node.name), cairn::toJson(node));
    }
    CAIRN_INFO("cairn_keys: wrote keys for ", nodes.size(), " nodes under ", node_data, "/nodes");
    return 0;
  });
}
