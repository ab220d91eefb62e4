// clusterize: plan a cairn job — profile a TorchScript model, cut it into stages, place them on the
// nodes of node_configs.json, write node_data/ — and, after training, merge the trained stages
// back into the original model (--merge). See `clusterize --help` and docs/CLUSTERIZE.md.
// The flags are apps/ClusterizeFlags.h, the modes apps/ClusterizeCommands.h.
#include <CLI/CLI.hpp>

#include "apps/ClusterizeCommands.h"
#include "apps/ClusterizeFlags.h"
#include "core/Error.h"
#include "core/MainGuard.h"

namespace {

using namespace cairn::apps;

constexpr const char* kProgram = "clusterize";

// A combination of flags no mode takes: the error line and exit code 2.
int refuse(const char* message) {
  return cairn::runGuarded(kProgram, [message]() -> int { CAIRN_THROW(BadInput, message); });
}

// The mode the flags pick, or the combination they refuse; --rebalance and --merge check that
// no other flag was given, planning is the default.
int dispatch(const CLI::App& app, ClusterizeFlags& flags) {
  if (flags.rebalance->count() > 0)
    return cairn::runGuarded(kProgram, [&] { return runRebalance(app, flags); });
  if (flags.cluster_option->count() > 0 && flags.merge->count() == 0)
    return refuse("--cluster needs --merge or --rebalance");
  if (flags.merge->count() > 0)
    return cairn::runGuarded(kProgram, [&] { return runMerge(app, flags); });
  if (flags.serve_option->count() > 0 && flags.resume_from_option->count() > 0)
    return refuse("--resume-from is for planning with --nodes, not --serve");
  if (flags.serve_option->count() > 0)
    return cairn::runGuarded(kProgram, [&] { return runServe(flags); });
  return cairn::runGuarded(kProgram, [&] { return runPlan(flags); });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "clusterize: profile a TorchScript model, cut its forward graph into stages, form clusters "
      "of nodes and write node_data/ (plan.json, job.json, nodes/node_<id>/{stage.pt,node.json}).\n"
      "Example: clusterize --model cnn.pt --nodes node_data/node_configs.json --input-shape "
      "64,1,28,28\n"
      "After training: clusterize --merge node_data --out trained.pt [--format safetensors] "
      "[--cluster N]"};
  ClusterizeFlags flags(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return dispatch(app, flags);
}
