// Serves GET /metrics (Prometheus text format) for one prometheus-cpp registry over plain HTTP,
// for the planner (planner/metrics) and the agent (agent/metrics). Start() binds synchronously,
// so port() is valid as soon as it returns; destruction stops serving (within ~0.2 s). One
// scrape at a time, each bounded by a 5 s socket timeout. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace memplan {

class MetricsServer {
 public:
  // address: "host:port", e.g. "0.0.0.0:9464" or "127.0.0.1:0" (port 0 = any free port).
  // UNAVAILABLE naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The bound TCP port.
  int port() const;

 private:
  MetricsServer(std::shared_ptr<prometheus::Registry> registry, int listen_fd, int port);
  void Serve();
  void Answer(int fd);

  const std::shared_ptr<prometheus::Registry> registry_;
  const int listen_fd_;
  const int port_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace memplan
