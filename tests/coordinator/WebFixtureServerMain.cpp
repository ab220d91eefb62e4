// web_fixture_server: the coordinator's WebServer serving a fixed state file, for
// tests/integration/coordinator_web_test.py (the page in headless Chromium against a snapshot that
// holds every kind of figure and hostile volunteer text) and for working on the page by hand.
//   web_fixture_server --state STATE.json [--metrics METRICS.txt] [--listen 127.0.0.1:0]
// The files are read again on every request. Prints "serving URL" once it listens; stops when its
// standard input closes.
#include <CLI/CLI.hpp>

#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>

#include "coordinator/WebServer.h"
#include "core/Error.h"
#include "core/MainGuard.h"

namespace {
std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot read");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"web_fixture_server: the coordinator's web page over a fixed state file"};
  std::string state_path, metrics_path, listen = "127.0.0.1:0";
  app.add_option("--state", state_path, "JSON file answered at /api/state")->required();
  app.add_option("--metrics", metrics_path, "text file answered at /metrics");
  app.add_option("--listen", listen, "HOST:PORT (port 0: the kernel picks)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return cairn::runGuarded("web_fixture_server", [&] {
    if (!nlohmann::json::parse(readFile(state_path)).is_object())  // fail early on a bad file
      CAIRN_THROW(BadInput, state_path, ": expected a JSON object (RunView::snapshot's schema)");
    cairn::coordinator::WebServer server(
        listen, [&] { return nlohmann::json::parse(readFile(state_path)); },
        [&] { return metrics_path.empty() ? std::string() : readFile(metrics_path); }, "--listen");
    std::cout << "serving " << server.url() << std::endl;
    // Ends when the test closes our standard input (or kills us).
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    server.stop();
    return 0;
  });
}
