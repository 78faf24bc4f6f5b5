// Serves GET /metrics (Prometheus text format) for one registry over HTTP.
// Start() binds synchronously, so port() is valid as soon as it returns; destruction stops serving.
// Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace memplan {

class MetricsServer {
 public:
  // address: "host:port", e.g. "0.0.0.0:9464" or "127.0.0.1:0" (port 0 = any free port).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound TCP port.
  int port() const;

 private:
  MetricsServer(std::shared_ptr<prometheus::Registry> registry,
                std::unique_ptr<prometheus::Exposer> exposer, int port);

  // The exposer only holds a weak reference; keeping the registry here keeps scrapes meaningful.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace memplan
