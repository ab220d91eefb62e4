// ClusterizeCommands: the clusterize binary's modes, one function each, run on the parsed flags:
// re-cut a cluster from its measurements (--rebalance), merge the trained stages into the model
// (--merge), coordinate volunteers (--serve), and plan onto node_configs.json (the default).
// Each returns the exit code and reports errors by throwing cairn::Error; the caller runs it
// through runGuarded (apps/clusterize_main.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include "apps/ClusterizeFlags.h"

namespace cairn::apps {

int runRebalance(const CLI::App& app, const ClusterizeFlags& flags);
int runMerge(const CLI::App& app, const ClusterizeFlags& flags);
// Installs the SIGINT/SIGTERM handling that stops the coordinator at its next loop turn.
int runServe(ClusterizeFlags& flags);
int runPlan(ClusterizeFlags& flags);

}  // namespace cairn::apps
