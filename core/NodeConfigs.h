// node_configs.json, in Ravnest's format (seed 002) plus an optional compute figure and GPUs:
//   { "0": { "IP": "127.0.0.1:5000",
//            "benchmarks": { "ram": 8, "bandwidth": 20, "compute": 35.5,
//                            "gpus": [ { "name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.1,
//                                        "fp32_tflops": 51.0, "bf16_tflops": 600.0,
//                                        "h2d_gb_per_s": 25.0, "d2h_gb_per_s": 24.0 } ] } }, ... }
// ram is in GB (of CPU RAM or GPU memory), bandwidth in Mbps, compute in GFLOPS (as measured by
// `provider --probe`) or a relative speed; all must be positive. gpus (optional) is the shared
// GPU vocabulary of core/GpuFigures.h, validated there; a node with a GPU trains on its first one
// (what `provider --device auto` picks), so clusterize plans with gpus[0].
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/GpuFigures.h"

namespace cairn {

struct NodeConfig {
  std::string id;              // the key in node_configs.json ("3")
  std::string name;            // "node_3": the name used in node_data/ and on the wire
  std::string host;            // from "IP": "host:port"
  int port = 0;
  double ram_gb = 0;
  double bandwidth_mbps = 0;
  std::optional<double> compute;  // GFLOPS or relative speed; absent: all nodes equal
  std::vector<GpuFigures> gpus;   // benchmarks.gpus; empty: a CPU node. It trains on gpus[0].

  std::string address() const { return host + ":" + std::to_string(port); }
};

// Parses and validates; `source` names the file in errors. Nodes come back ordered by id
// (numerically when all ids are integers). Throws BadInput on the first problem.
std::vector<NodeConfig> parseNodeConfigs(const nlohmann::json& document, const std::string& source);
std::vector<NodeConfig> readNodeConfigs(const std::string& path);

// True for a host that names this machine's loopback: localhost, *.localhost, 127.0.0.0/8 as a
// dotted quad, ::1 (lower case, no brackets, no port). Used by the coordinator's web view (who may
// ask) and the transport (which peers are on this host).
bool isLoopbackName(const std::string& host);

// Splits "host:port" ("[2001:db8::1]:7100" for an IPv6 address: `host` keeps the brackets, as
// ZeroMQ endpoints want them); throws BadInput "<context>: <key> must be host:port ..." when
// malformed, and names the brackets an IPv6 address needs.
void parseHostPort(const std::string& text, const std::string& context, const std::string& key,
                   std::string* host, int* port);
// A host that binds every interface and that nobody can dial: "", "*", "0.0.0.0", "::", "[::]".
bool isWildcardHost(const std::string& host);
// `host` as it goes before ":PORT": an IPv6 address in brackets ("::1" → "[::1]"), others as given.
std::string hostForPort(const std::string& host);

}  // namespace cairn
