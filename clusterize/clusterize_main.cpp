// clusterize: plan a cairn job. See `clusterize --help`.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "core/MainGuard.h"
#include "core/NodeConfigs.h"

int main(int argc, char** argv) {
  CLI::App app{
      "clusterize: profile a TorchScript model, cut it into stages and place them on nodes.\n"
      "Status: validates node_configs.json and prints the nodes. Cutting models (--model) is\n"
      "issue [B] and not implemented yet."};
  std::string nodes_path = "node_data/node_configs.json";
  std::string model_path;
  app.add_option("--nodes", nodes_path, "node_configs.json (Ravnest format)")->capture_default_str();
  app.add_option("--model", model_path, "TorchScript model (not implemented yet)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("clusterize", [&] {
    const auto nodes = cairn::readNodeConfigs(nodes_path);
    std::printf("%-12s %-22s %10s %14s %12s\n", "node", "address", "ram (GB)", "bandwidth (Mbps)",
                "compute");
    for (const auto& n : nodes) {
      std::printf("%-12s %-22s %10.2f %16.1f %12s\n", n.name.c_str(), n.address().c_str(), n.ram_gb,
                  n.bandwidth_mbps, n.compute ? std::to_string(*n.compute).c_str() : "-");
    }
    if (!model_path.empty()) {
      std::fprintf(stderr, "clusterize: --model: cutting models is not implemented yet (issue [B])\n");
      return 1;
    }
    return 0;
  });
}
