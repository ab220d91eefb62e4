// WebServer: cpp-httplib serving the embedded page, the state JSON and the Prometheus text.
#include "coordinator/WebServer.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <exception>
#include <thread>

#include "core/Error.h"
#include "core/Log.h"
#include "core/NodeConfigs.h"

namespace cairn::coordinator {
namespace {

// Everything the page needs comes from this origin; nothing inline, no plugins, no frames, no
// forms. Chart.js sizes its canvas through element.style (CSSOM), which style-src allows.
constexpr const char* kContentSecurityPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'none'";

constexpr size_t kRequestThreads = 4;

// "HOST:PORT" or "[V6]:PORT", port 0..65535.
void parseListen(const std::string& text, const std::string& flag, std::string* host, int* port) {
  const std::string expected =
      flag + " must be HOST:PORT, e.g. 127.0.0.1:8080 (port 0: the kernel picks one); got \"" +
      text + "\"";
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size() ||
      text.size() - colon - 1 > 5 ||
      text.find_first_not_of("0123456789", colon + 1) != std::string::npos)
    CAIRN_THROW(BadInput, expected);
  const int value = std::stoi(text.substr(colon + 1));
  if (value > 65535) CAIRN_THROW(BadInput, expected);
  std::string h = text.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') CAIRN_THROW(BadInput, expected);
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    CAIRN_THROW(BadInput, expected, " (write an IPv6 address as [ADDRESS]:PORT)");
  }
  *host = h;
  *port = value;
}

// The host name of a Host header: "[::1]:8080" → "::1", "Localhost:80" → "localhost".
std::string hostName(std::string header) {
  for (char& c : header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!header.empty() && header.front() == '[') {
    const auto close = header.find(']');
    return close == std::string::npos ? header : header.substr(1, close - 1);
  }
  const auto colon = header.find(':');
  return colon == std::string::npos ? header : header.substr(0, colon);
}

}  // namespace

struct WebServer::Impl {
  httplib::Server server;
  StateFn state;
  MetricsFn metrics;
  std::string host;
  int port = 0;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
  bool stopped = false;

  void routes();
  void configureConnections();
  void filterRequests();
  void answerErrors();
  void serveContent();
};

void WebServer::Impl::routes() {
  configureConnections();
  filterRequests();
  answerErrors();
  serveContent();
}

// Threads, keep-alive, socket options and the headers every answer carries.
void WebServer::Impl::configureConnections() {
  // A connection holds a pool thread for as long as it is kept alive: a browser opens up to six
  // at once for the page's files, so a short keep-alive keeps a small pool from making the later
  // ones wait for the earlier ones' idle timeout.
  server.new_task_queue = [] { return new httplib::ThreadPool(kRequestThreads); };
  server.set_keep_alive_timeout(1);
  // httplib's default also sets SO_REUSEPORT, which lets a second process bind the same port and
  // share (or take) the page's connections; SO_REUSEADDR alone still allows a quick restart.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_default_headers({{"Content-Security-Policy", kContentSecurityPolicy},
                              {"X-Content-Type-Options", "nosniff"},
                              {"Referrer-Policy", "no-referrer"},
                              {"Cache-Control", "no-store"}});
}

void WebServer::Impl::filterRequests() {
  // Read-only: GET (and HEAD, which is GET without the body) on the routes below, nothing else.
  // Bound to loopback, it answers only requests addressed to a loopback name: a web page the
  // researcher visits cannot point a name of its own at 127.0.0.1 (DNS rebinding) and read the
  // run through the researcher's browser. (Bound elsewhere, the operator chose to expose it.)
  const bool loopback_only = isLoopbackName(hostName(host));
  server.set_pre_routing_handler([loopback_only](const httplib::Request& request,
                                                 httplib::Response& response) {
    const std::string asked = request.get_header_value("Host");
    if (loopback_only && !asked.empty() && !isLoopbackName(hostName(asked))) {
      response.status = 403;
      response.set_content("403 forbidden: this view listens on loopback and answers only to "
                           "localhost, 127.0.0.1 or [::1] (got Host: " + asked.substr(0, 200) +
                               ")\n",
                           "text/plain; charset=utf-8");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (request.method == "GET" || request.method == "HEAD")
      return httplib::Server::HandlerResponse::Unhandled;
    response.status = 405;
    response.set_header("Allow", "GET, HEAD");
    response.set_content("405 method not allowed: this page is read-only (GET)\n",
                         "text/plain; charset=utf-8");
    return httplib::Server::HandlerResponse::Handled;
  });
}

// Errors as one line of text: 404 names the routes, an exception is logged and answered 500.
void WebServer::Impl::answerErrors() {
  server.set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    if (response.status == 404)
      response.set_content("404 not found: " + request.path +
                               " (routes: / /app.js /style.css /chart.js /api/state /metrics)\n",
                           "text/plain; charset=utf-8");
    else
      response.set_content(std::to_string(response.status) + "\n", "text/plain; charset=utf-8");
  });
  server.set_exception_handler(
      [](const httplib::Request& request, httplib::Response& response, std::exception_ptr error) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        CAIRN_WARN("web: ", request.path, " failed: ", what);
        response.status = 500;
        response.set_content("500 internal error: " + what + "\n", "text/plain; charset=utf-8");
      });
}

// The routes: the state, the metrics and the page's embedded files.
void WebServer::Impl::serveContent() {
  // Exact paths only: httplib's patterns are regular expressions, and these have no specials
  // but '.', which is escaped.
  server.Get("/api/state", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(state().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                         "application/json");
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  for (const char* path : {"/", "/app\\.js", "/style\\.css", "/chart\\.js"}) {
    std::string route = path;
    std::string plain;
    for (char c : route)
      if (c != '\\') plain += c;
    const WebAsset* asset = findWebAsset(plain);
    if (!asset) CAIRN_THROW(InternalError, "web: no embedded file for ", plain);
    server.Get(route, [asset](const httplib::Request&, httplib::Response& response) {
      response.set_content(reinterpret_cast<const char*>(asset->data), asset->size,
                           asset->content_type);
    });
  }
}

WebServer::WebServer(const std::string& listen, StateFn state, MetricsFn metrics_text,
                     const std::string& flag)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  parseListen(listen, flag, &s.host, &s.port);
  s.state = std::move(state);
  s.metrics = std::move(metrics_text);
  s.routes();
  if (s.port == 0) {
    s.port = s.server.bind_to_any_port(s.host);
    if (s.port < 0) s.port = 0;
  } else if (!s.server.bind_to_port(s.host, s.port)) {
    s.port = 0;
  }
  if (s.port == 0)
    CAIRN_THROW(BadInput, flag, " ", listen,
                ": cannot listen there (the address is not this machine's, or the port is in use "
                "or needs privileges); give another HOST:PORT, or port 0 for any free one");
  s.thread = std::thread([&s] {
    s.server.listen_after_bind();
    s.listen_returned = true;
  });
  // stop() may only be called once the server runs (httplib ignores an earlier one): wait for
  // the listening thread to get there (or to have failed), as httplib's own wait_until_ready does.
  while (!s.server.is_running() && !s.listen_returned)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (s.listen_returned) {
    s.thread.join();
    s.stopped = true;
    CAIRN_THROW(BadInput, flag, " ", listen, ": bound, but could not listen there");
  }
}

WebServer::~WebServer() { stop(); }

int WebServer::port() const { return impl_->port; }

std::string WebServer::url() const {
  const std::string& host = impl_->host;
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(impl_->port) + "/";
}

void WebServer::stop() {
  Impl& s = *impl_;
  if (s.stopped) return;
  s.stopped = true;
  if (s.server.is_running()) s.server.stop();
  if (s.thread.joinable()) s.thread.join();
}

}  // namespace cairn::coordinator
