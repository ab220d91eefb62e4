// provider: the one binary a volunteer runs. See `provider --help`.
#include <CLI/CLI.hpp>

#include "core/Log.h"
#include "core/MainGuard.h"
#include "core/NodeData.h"
#include "node/ZmqTransport.h"

int main(int argc, char** argv) {
  CLI::App app{
      "provider: run one node of a cairn plan.\n"
      "Status: loads and validates nodes/<name>/node.json and job.json and binds the node's\n"
      "endpoint. Training (issue [C]) is not implemented yet; the command then exits 1."};
  std::string name;
  std::string node_data = "node_data";
  app.add_option("--name", name, "node name as in node_data/nodes/ (e.g. node_3)")->required();
  app.add_option("--node-data", node_data, "folder written by clusterize")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("provider", [&] {
    cairn::setLogTag(name);
    const cairn::NodeSpec node = cairn::readNodeSpec(cairn::nodeSpecPath(node_data, name));
    const cairn::JobSpec job = cairn::readJobSpec(cairn::jobSpecPath(node_data));
    zmq::context_t context;
    cairn::ZmqTransport transport(context, name, "tcp://" + node.address);
    CAIRN_INFO("job ", job.job_id, ": cluster ", node.cluster, ", stage ", node.stage + 1, "/",
               node.num_stages, " (", cairn::toString(node.role), "), listening on ", node.address);
    CAIRN_ERROR("training is not implemented yet (issue [C])");
    return 1;
  });
}
