// WebServer over real loopback HTTP (cpp-httplib's client): each route's body, content type and
// security headers; the embedded page files against the files in coordinator/web/; 404 and 405;
// bind failures as BadInput naming the flag; a failing state function answered 500. The page
// itself in a browser: tests/integration/coordinator_web_test.py.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "coordinator/WebServer.h"
#include "core/Error.h"

namespace cairn::coordinator {
namespace {

std::string readSource(const std::string& relative) {
  std::ifstream in(std::string(CAIRN_SOURCE_DIR) + "/" + relative, std::ios::binary);
  EXPECT_TRUE(in.good()) << relative;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

const nlohmann::json kState = nlohmann::json::parse(R"({
  "run": {"phase": "training", "now": 1700000100.5, "started_at": 1700000000, "num_clusters": 1,
          "members": 2, "records": 7, "dropped": 0},
  "clusters": [{"id": 0, "nodes": ["node_0", "<img src=x onerror=alert(1)>"], "step": 3,
                "max_steps": 10, "loss": 0.5, "samples_per_s": 12.5, "eta_s": 20,
                "loss_history": [[1, 0.9], [2, 0.7], [3, 0.5]], "eval_history": [],
                "throughput_history": [[3, 12.5]]}],
  "nodes": [], "events": [{"t": 1700000050, "node": "node_0", "kind": "joined",
                           "message": "caf\u00e9 </script>"}]})");
const std::string kMetrics = "# TYPE cairn_step gauge\ncairn_step{cluster=\"0\"} 3\n";

class WebServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<WebServer>(
        "127.0.0.1:0", [this] { ++state_calls_; return kState; }, [] { return kMetrics; });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_connection_timeout(5);
    client_->set_read_timeout(5);
  }
  httplib::Result get(const std::string& path) { return client_->Get(path.c_str()); }

  std::atomic<int> state_calls_{0};
  std::unique_ptr<WebServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

void expectSecurityHeaders(const httplib::Response& response, const std::string& path) {
  const std::string csp = response.get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'self'"), std::string::npos) << path << ": " << csp;
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << path << ": " << csp;
  EXPECT_NE(csp.find("object-src 'none'"), std::string::npos) << path << ": " << csp;
  EXPECT_EQ(csp.find("unsafe"), std::string::npos) << path << ": " << csp;  // no unsafe-inline/eval
  EXPECT_EQ(response.get_header_value("X-Content-Type-Options"), "nosniff") << path;
}

TEST_F(WebServerTest, ServesTheEmbeddedPageFilesByteForByte) {
  ASSERT_GT(server_->port(), 0);
  EXPECT_EQ(server_->url(), "http://127.0.0.1:" + std::to_string(server_->port()) + "/");
  const struct {
    const char* path;
    const char* file;
    const char* type;
  } files[] = {{"/", "coordinator/web/index.html", "text/html; charset=utf-8"},
               {"/app.js", "coordinator/web/app.js", "application/javascript; charset=utf-8"},
               {"/style.css", "coordinator/web/style.css", "text/css; charset=utf-8"},
               {"/chart.js", "coordinator/web/vendor/chart.min.js",
                "application/javascript; charset=utf-8"}};
  for (const auto& f : files) {
    auto response = get(f.path);
    ASSERT_TRUE(response) << f.path << ": " << httplib::to_string(response.error());
    EXPECT_EQ(response->status, 200) << f.path;
    EXPECT_EQ(response->get_header_value("Content-Type"), f.type) << f.path;
    EXPECT_EQ(response->body, readSource(f.file)) << f.path;
    expectSecurityHeaders(*response, f.path);
  }
  // The vendored file is Chart.js itself (its banner), as docs/OPERATIONS.md names it.
  EXPECT_NE(get("/chart.js")->body.find("Chart.js v3.9.1"), std::string::npos);
}

TEST_F(WebServerTest, StateIsTheStateFunctionsJsonOnEveryRequest) {
  for (int i = 1; i <= 2; ++i) {
    auto response = get("/api/state");
    ASSERT_TRUE(response);
    EXPECT_EQ(response->status, 200);
    EXPECT_EQ(response->get_header_value("Content-Type"), "application/json");
    EXPECT_EQ(response->get_header_value("Cache-Control"), "no-store");
    expectSecurityHeaders(*response, "/api/state");
    EXPECT_EQ(nlohmann::json::parse(response->body), kState);
    EXPECT_EQ(state_calls_.load(), i);  // asked afresh each time, never cached
  }
}

TEST_F(WebServerTest, MetricsArePrometheusText) {
  auto response = get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(response->body, kMetrics);
  expectSecurityHeaders(*response, "/metrics");
}

TEST_F(WebServerTest, UnknownPathsAre404) {
  for (const char* path : {"/index.html", "/api", "/api/state/x", "/app.jsx", "/appxjs", "/chart.min.js",
                           "/metrics/", "/../coordinator.key", "/vendor/chart.min.js"}) {
    auto response = get(path);
    ASSERT_TRUE(response) << path;
    EXPECT_EQ(response->status, 404) << path;
    EXPECT_EQ(response->get_header_value("Content-Type"), "text/plain; charset=utf-8") << path;
    expectSecurityHeaders(*response, path);
  }
  EXPECT_EQ(state_calls_.load(), 0);
}

TEST_F(WebServerTest, EveryMethodButGetAndHeadIs405) {
  for (const char* path : {"/", "/api/state", "/metrics", "/nowhere"}) {
    std::vector<httplib::Result> answers;
    answers.push_back(client_->Post(path, "x", "text/plain"));
    answers.push_back(client_->Put(path, "x", "text/plain"));
    answers.push_back(client_->Patch(path, "x", "text/plain"));
    answers.push_back(client_->Delete(path));
    answers.push_back(client_->Options(path));
    for (auto& response : answers) {
      ASSERT_TRUE(response) << path;
      EXPECT_EQ(response->status, 405) << path;
      EXPECT_EQ(response->get_header_value("Allow"), "GET, HEAD") << path;
      expectSecurityHeaders(*response, path);
    }
  }
  EXPECT_EQ(state_calls_.load(), 0);  // a refused method never reaches the state
  auto head = client_->Head("/");
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->body.empty());
}

// Several clients at once while the state changes under its own lock (as RunView's does): every
// answer is a whole, consistent state, and each client sees its values never go backwards.
TEST(WebServer, ServesConcurrentClientsWhileTheStateChanges) {
  std::mutex mutex;
  int64_t version = 0;
  WebServer server(
      "127.0.0.1:0",
      [&] {
        std::lock_guard<std::mutex> lock(mutex);
        return nlohmann::json{{"version", version}, {"twice", 2 * version}};
      },
      [&] {
        std::lock_guard<std::mutex> lock(mutex);
        return "cairn_version " + std::to_string(version) + "\n";
      });
  std::atomic<bool> done{false};
  std::thread writer([&] {
    while (!done) {
      std::lock_guard<std::mutex> lock(mutex);
      ++version;
    }
  });
  constexpr int kClients = 6, kRequests = 40;  // more clients than request threads
  std::vector<std::thread> clients;
  std::atomic<int> answered{0};
  std::vector<std::string> failures(kClients);
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", server.port());
      client.set_read_timeout(10);
      int64_t last = -1;
      for (int i = 0; i < kRequests; ++i) {
        auto response = client.Get(i % 4 == 3 ? "/metrics" : "/api/state");
        if (!response || response->status != 200) {
          failures[c] = "request " + std::to_string(i) + " failed";
          return;
        }
        int64_t seen = 0;
        if (i % 4 == 3) {
          seen = std::stoll(response->body.substr(std::string("cairn_version ").size()));
        } else {
          const auto state = nlohmann::json::parse(response->body);
          seen = state.at("version").get<int64_t>();
          if (state.at("twice").get<int64_t>() != 2 * seen) failures[c] = "a torn state";
        }
        if (seen < last) failures[c] = "the version went backwards";
        last = seen;
        ++answered;
      }
    });
  }
  for (auto& t : clients) t.join();
  done = true;
  writer.join();
  for (int c = 0; c < kClients; ++c) EXPECT_EQ(failures[c], "") << "client " << c;
  EXPECT_EQ(answered.load(), kClients * kRequests);
}

// DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host:
// evil.example; a loopback-bound server refuses it and answers loopback names (any port: an SSH
// tunnel's local port differs from the bound one).
TEST_F(WebServerTest, OnLoopbackOnlyLoopbackHostNamesAreAnswered) {
  for (const char* host : {"evil.example", "evil.example:8080", "127.0.0.1.evil.example",
                           "localhost.evil.example", "[::2]:80", "10.0.0.1"}) {
    auto response = client_->Get("/api/state", {{"Host", host}});
    ASSERT_TRUE(response) << host;
    EXPECT_EQ(response->status, 403) << host;
    EXPECT_NE(response->body.find("Host: " + std::string(host)), std::string::npos) << host;
    expectSecurityHeaders(*response, host);
  }
  EXPECT_EQ(state_calls_.load(), 0);
  for (const char* host : {"127.0.0.1", "127.0.0.1:9000", "LOCALHOST:9000", "localhost",
                           "app.localhost:1", "[::1]:8080", "127.1.2.3"}) {
    auto response = client_->Get("/api/state", {{"Host", host}});
    ASSERT_TRUE(response) << host;
    EXPECT_EQ(response->status, 200) << host;
  }
}

TEST(WebServer, BoundElsewhereAnyHostNameIsAnswered) {
  WebServer server("0.0.0.0:0", [] { return nlohmann::json("all"); }, [] { return std::string(); });
  httplib::Client client("127.0.0.1", server.port());
  auto response = client.Get("/api/state", {{"Host", "coordinator.example:8080"}});
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "\"all\"");
}

TEST(WebServer, AFailingStateIsAnswered500AndTheServerGoesOn) {
  std::atomic<bool> fail{true};
  WebServer server(
      "127.0.0.1:0",
      [&] {
        if (fail) throw std::runtime_error("the view is not ready");
        return nlohmann::json{{"ok", true}};
      },
      [] { return std::string(); });
  httplib::Client client("127.0.0.1", server.port());
  auto broken = client.Get("/api/state");
  ASSERT_TRUE(broken);
  EXPECT_EQ(broken->status, 500);
  EXPECT_NE(broken->body.find("the view is not ready"), std::string::npos);
  fail = false;
  auto fine = client.Get("/api/state");
  ASSERT_TRUE(fine);
  EXPECT_EQ(fine->status, 200);
  EXPECT_EQ(nlohmann::json::parse(fine->body), (nlohmann::json{{"ok", true}}));
}

std::string badInputMessage(const std::string& listen) {
  try {
    WebServer server(listen, [] { return nlohmann::json(); }, [] { return std::string(); });
  } catch (const BadInput& e) {
    return e.what();
  }
  return "(no BadInput)";
}

TEST(WebServer, BadOrTakenAddressesAreBadInputNamingTheFlagAndAddress) {
  WebServer first("127.0.0.1:0", [] { return nlohmann::json(); }, [] { return std::string(); });
  const std::string taken = "127.0.0.1:" + std::to_string(first.port());
  const std::string message = badInputMessage(taken);
  EXPECT_NE(message.find("--web " + taken + ": cannot listen there"), std::string::npos) << message;
  // An address that is not this machine's (TEST-NET-1, RFC 5737): the bind itself fails.
  EXPECT_NE(badInputMessage("192.0.2.1:0").find("--web 192.0.2.1:0: cannot listen"),
            std::string::npos);
  for (const std::string bad : {"8080", "127.0.0.1", "127.0.0.1:", ":8080", "127.0.0.1:65536",
                                "127.0.0.1:80a", "::1:8080", "[::1:8080", "127.0.0.1:-1"}) {
    const std::string text = badInputMessage(bad);
    EXPECT_NE(text.find("--web must be HOST:PORT"), std::string::npos) << bad << ": " << text;
    EXPECT_NE(text.find("\"" + bad + "\""), std::string::npos) << bad << ": " << text;
  }
  ErrorKind kind = ErrorKind::kInternal;
  try {
    WebServer server(taken, [] { return nlohmann::json(); }, [] { return std::string(); },
                     "--other-flag");
  } catch (const Error& e) {
    kind = e.kind();
    EXPECT_NE(std::string(e.what()).find("--other-flag"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kind, ErrorKind::kBadInput);
}

TEST(WebServer, StopsCleanlyAndRefusesConnectionsAfterwards) {
  auto server = std::make_unique<WebServer>("127.0.0.1:0", [] { return nlohmann::json(1); },
                                            [] { return std::string(); });
  const int port = server->port();
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(false);
  ASSERT_TRUE(client.Get("/api/state"));
  server->stop();
  server->stop();  // idempotent
  httplib::Client after("127.0.0.1", port);
  after.set_connection_timeout(2);
  EXPECT_FALSE(after.Get("/api/state"));
  server.reset();  // the destructor after stop() is fine too
  // The port is free again for a new server.
  WebServer again("127.0.0.1:" + std::to_string(port), [] { return nlohmann::json(2); },
                  [] { return std::string(); });
  httplib::Client client2("127.0.0.1", port);
  auto response = client2.Get("/api/state");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->body, "2");
}

TEST(WebServer, ServesIpv6Loopback) {
  std::unique_ptr<WebServer> v6;
  try {
    v6 = std::make_unique<WebServer>("[::1]:0", [] { return nlohmann::json("v6"); },
                                     [] { return std::string(); });
  } catch (const BadInput& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  WebServer& server = *v6;
  EXPECT_EQ(server.url(), "http://[::1]:" + std::to_string(server.port()) + "/");
  httplib::Client client("::1", server.port());
  auto response = client.Get("/api/state");
  if (!response) GTEST_SKIP() << "no IPv6 loopback here: " << httplib::to_string(response.error());
  EXPECT_EQ(response->body, "\"v6\"");
}

}  // namespace
}  // namespace cairn::coordinator
