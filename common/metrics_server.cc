#include "common/metrics_server.h"

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace memplan {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  if (registry == nullptr) return absl::InvalidArgumentError("registry: must not be null");
  if (address.empty()) return absl::InvalidArgumentError("metrics address: must not be empty");
  std::unique_ptr<prometheus::Exposer> exposer;
  // CivetServer reports a failed bind by throwing; convert it here so nothing escapes.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics address ", address, ": cannot listen: ", e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics address ", address, ": no bound port"));
  }
  exposer->RegisterCollectable(registry);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(registry), std::move(exposer), ports.front()));
}

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry,
                             std::unique_ptr<prometheus::Exposer> exposer, int port)
    : registry_(std::move(registry)), exposer_(std::move(exposer)), port_(port) {}

MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const { return port_; }

}  // namespace memplan
