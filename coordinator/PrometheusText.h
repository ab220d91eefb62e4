// PrometheusText: a RunView snapshot (RunView.h has its schema) in Prometheus' text exposition
// format, version 0.0.4 — what RunView::prometheus() returns and the web server's /metrics serves
// (docs/OPERATIONS.md "The live page"). Run figures without labels, cluster figures labelled
// {cluster}, node figures {node, cluster}, and cairn_node_info {node, cluster, role, stage, state}
// = 1, the credit {volunteer, key, node}; a figure the snapshot does not know (null) has no sample.
// Thread-safety: pure functions.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace cairn::coordinator {

std::string prometheusText(const nlohmann::json& snapshot);

// Prometheus label value escaping: backslash, double quote and newline.
std::string escapePrometheusLabel(const std::string& value);

}  // namespace cairn::coordinator
