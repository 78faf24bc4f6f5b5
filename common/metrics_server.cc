#include "common/metrics_server.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/http_server.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace memplan {
namespace {

// Compares every byte so that the time taken does not tell how much of a guess was right.
bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

}  // namespace

void RegisterBuildInfo(prometheus::Registry& registry) {
  prometheus::BuildGauge()
      .Name("memplan_build_info")
      .Help("Always 1; the labels say which build serves this endpoint.")
      .Register(registry)
      .Add({{"version", std::string(build_info::kVersion)},
            {"git_sha", std::string(build_info::kGitSha)},
            {"build_type", std::string(build_info::kBuildType)}})
      .Set(1);
}

// [Own /metrics server] prometheus-cpp's Exposer (civetweb 1.15 as Debian 12 builds it) did not
// start inside memplan-agent ("null context when constructing CivetServer" after binding), and
// that civetweb's TLS crashes on the first handshake with OpenSSL 3, so /metrics and the webhook
// share one small bounded server core (common/http_server.h) instead.
absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  if (registry == nullptr) return absl::InvalidArgumentError("registry: must not be null");
  if (options.address.empty()) {
    return absl::InvalidArgumentError("metrics address: must not be empty");
  }
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  server->registry_ = std::move(registry);
  HttpServerOptions http;
  http.address = options.address;
  http.name = "metrics";
  http.max_connections = options.max_connections;
  http.request_seconds = options.request_seconds;
  http.max_header_bytes = 8 << 10;
  http.max_body_bytes = 0;
  prometheus::Registry* const registry_ptr = server->registry_.get();
  const std::string expected =
      options.bearer_token.empty() ? "" : absl::StrCat("Bearer ", options.bearer_token);
  absl::StatusOr<std::unique_ptr<HttpServer>> http_server = HttpServer::Start(
      http, [](int fd, HttpDeadline) { return PlainHttpStream(fd); },
      [registry_ptr, expected](const HttpRequest& request) -> HttpAnswer {
        const std::string route = request.path.substr(0, request.path.find('?'));
        if (route != "/metrics") return {404, "text/plain", "not found; GET /metrics\n"};
        if (request.method != "GET") return {405, "text/plain", "GET /metrics\n"};
        if (!expected.empty() && !SameToken(request.authorization, expected)) {
          return {401, "text/plain", "Authorization: Bearer <token> required\n"};
        }
        return {200, "text/plain; version=0.0.4; charset=utf-8",
                prometheus::TextSerializer().Serialize(registry_ptr->Collect())};
      });
  if (!http_server.ok()) return http_server.status();
  server->server_ = *std::move(http_server);
  return server;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  MetricsServerOptions options;
  options.address = address;
  return Start(options, std::move(registry));
}

// Out of line: HttpServer is complete here.
MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const { return server_->port(); }

}  // namespace memplan
