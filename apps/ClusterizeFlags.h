// ClusterizeFlags: every flag of the clusterize binary and the values it is read into. The
// constructor declares the flags on the CLI11 app in --help's order (planning, --serve, --merge,
// --rebalance, --resume-from); the modes (apps/ClusterizeCommands.h) read the values, and the
// options' counts, after parsing. The app binds the members' addresses: not copyable or movable.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "clusterize/Clusterize.h"
#include "coordinator/Coordinator.h"

namespace cairn::apps {

struct ClusterizeFlags {
  // Planning (--model also for --merge).
  clusterize::ClusterizeOptions plan;
  std::string out_dir = "node_data";
  std::string granularity = "top";
  int microbatches = 4;            // applies only when --microbatches is given
  std::string optimizer = "adam";  // applies only when --optimizer is given
  // --serve: the coordinator's options, and those given in other units or files.
  coordinator::CoordinatorOptions serve;
  double gather_s = 30, reach_timeout_s = 5, lost_after_s = 15, gone_after_s = 3;
  std::string allow_keys_path;
  double view_every_s = -1;  // < 0: by whether stdout is a terminal
  std::string web_listen;
  // --merge, --rebalance, --resume-from.
  std::string merge_from;
  std::string format = "torchscript";
  int cluster = 0;
  std::string rebalance_from;
  std::string resume_from;
  int64_t resume_step = -1;

  // The options whose presence picks a mode, or that a mode checks.
  CLI::Option* model = nullptr;
  CLI::Option* out = nullptr;
  CLI::Option* microbatches_option = nullptr;
  CLI::Option* optimizer_option = nullptr;
  CLI::Option* serve_option = nullptr;
  CLI::Option* merge = nullptr;
  CLI::Option* format_option = nullptr;
  CLI::Option* cluster_option = nullptr;
  CLI::Option* rebalance = nullptr;
  CLI::Option* resume_from_option = nullptr;

  explicit ClusterizeFlags(CLI::App& app);
  ClusterizeFlags(const ClusterizeFlags&) = delete;
  ClusterizeFlags& operator=(const ClusterizeFlags&) = delete;
};

}  // namespace cairn::apps
