// Serves GET /metrics (Prometheus text format) for one prometheus-cpp registry over plain HTTP,
// for the planner (planner/metrics) and the agent (agent/metrics), on the bounded server core of
// common/http_server.h: scrapes are served concurrently, each connection within a deadline, so an
// idle or dripping client cannot stall a scrape. Start() binds synchronously (port() is valid when
// it returns). Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace memplan {

class HttpServer;

// Adds memplan_build_info{version, git_sha, build_type} = 1 (common/build_info.h) to `registry`,
// the conventional info gauge: the planner's and the agent's metrics each call it once.
void RegisterBuildInfo(prometheus::Registry& registry);

struct MetricsServerOptions {
  // "host:port", e.g. "0.0.0.0:9464" or "127.0.0.1:0" (port 0 = any free port).
  std::string address;
  // Non-empty: a scrape must send "Authorization: Bearer <token>" (else 401).
  std::string bearer_token;
  int max_connections = 32;
  double request_seconds = 5;  // from accept to the end of the request
};

class MetricsServer {
 public:
  // UNAVAILABLE naming the address when it cannot listen; INVALID_ARGUMENT for an empty address
  // or a null registry.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsServerOptions& options, std::shared_ptr<prometheus::Registry> registry);
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound TCP port.
  int port() const;

 private:
  MetricsServer() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace memplan
