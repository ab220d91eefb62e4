#include "core/NodeConfigs.h"

#include <algorithm>
#include <cctype>

#include "core/JsonReader.h"

namespace cairn {
namespace {

bool isInteger(const std::string& s) {
  return !s.empty() && s.size() < 18 &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

bool validNodeId(const std::string& id) {
  // Ids become folder and peer names (node_<id>): keep them to a safe alphabet.
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-';
  });
}

}  // namespace

bool isLoopbackName(const std::string& host) {
  const std::string suffix = ".localhost";
  const bool dotted_127 = host.rfind("127.", 0) == 0 &&
                          host.find_first_not_of("0123456789.") == std::string::npos &&
                          std::count(host.begin(), host.end(), '.') == 3;
  return host == "localhost" || host == "::1" || dotted_127 ||
         (host.size() > suffix.size() &&
          host.compare(host.size() - suffix.size(), suffix.size(), suffix) == 0);
}

void parseHostPort(const std::string& text, const std::string& context, const std::string& key,
                   std::string* host, int* port) {
  const auto colon = text.rfind(':');
  const std::string expected = " must be host:port, e.g. \"127.0.0.1:5000\" (got \"" + text + "\")";
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size())
    CAIRN_THROW(BadInput, context, ": ", key, expected);
  const std::string port_text = text.substr(colon + 1);
  if (!isInteger(port_text)) CAIRN_THROW(BadInput, context, ": ", key, expected);
  const long value = std::stol(port_text);
  if (value < 1 || value > 65535)
    CAIRN_THROW(BadInput, context, ": ", key, " port must be between 1 and 65535 (got ", value, ")");
  *host = text.substr(0, colon);
  *port = static_cast<int>(value);
  const bool bracketed = host->size() >= 2 && host->front() == '[' && host->back() == ']';
  if (!bracketed && host->find_first_of("[]:") != std::string::npos)
    CAIRN_THROW(BadInput, context, ": ", key, " must be host:port with an IPv6 address in brackets, e.g. "
                "\"[2001:db8::1]:5000\" (got \"", text, "\")");
}

bool isWildcardHost(const std::string& host) {
  return host.empty() || host == "*" || host == "0.0.0.0" || host == "::" || host == "[::]";
}

std::string hostForPort(const std::string& host) {
  return host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
}

std::vector<NodeConfig> parseNodeConfigs(const nlohmann::json& document, const std::string& source) {
  if (!document.is_object())
    CAIRN_THROW(BadInput, source, ": expected an object mapping node ids to nodes (got ",
                jsonTypeName(document), ")");
  if (document.empty()) CAIRN_THROW(BadInput, source, ": no nodes (the object is empty)");
  std::vector<NodeConfig> nodes;
  for (auto it = document.begin(); it != document.end(); ++it) {
    const std::string context = source + ": node \"" + it.key() + "\"";
    if (!validNodeId(it.key()))
      CAIRN_THROW(BadInput, context,
                  ": node ids may use only letters, digits, '_' and '-' (at most 64)");
    JsonReader node(it.value(), context);
    node.rejectUnknownKeys({"IP", "benchmarks"});
    NodeConfig config;
    config.id = it.key();
    config.name = "node_" + it.key();
    parseHostPort(node.string("IP"), context, "IP", &config.host, &config.port);
    JsonReader bench = node.object("benchmarks");
    bench.rejectUnknownKeys({"ram", "bandwidth", "compute", "cores", "gpus"});
    config.ram_gb = bench.positiveNumber("ram");
    config.bandwidth_mbps = bench.positiveNumber("bandwidth");
    if (bench.has("compute")) config.compute = bench.positiveNumber("compute");
    if (bench.has("gpus"))
      config.gpus = parseGpuFigures(bench.raw()["gpus"], context + ": benchmarks.gpus");
    nodes.push_back(std::move(config));
  }
  const bool numeric = std::all_of(nodes.begin(), nodes.end(),
                                   [](const NodeConfig& n) { return isInteger(n.id); });
  std::sort(nodes.begin(), nodes.end(), [numeric](const NodeConfig& a, const NodeConfig& b) {
    return numeric ? std::stoll(a.id) < std::stoll(b.id) : a.id < b.id;
  });
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t j = i + 1; j < nodes.size(); ++j)
      if (nodes[i].address() == nodes[j].address())
        CAIRN_THROW(BadInput, source, ": node \"", nodes[j].id, "\": IP ", nodes[j].address(),
                    " is already used by node \"", nodes[i].id, "\"");
  return nodes;
}

std::vector<NodeConfig> readNodeConfigs(const std::string& path) {
  return parseNodeConfigs(readJsonFile(path), path);
}

}  // namespace cairn
