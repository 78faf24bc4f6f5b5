// memplan-planner assembled: SQLite store, metrics endpoint, the planner engine (PlannerStack:
// search executor, PlannerCore, service) and the gRPC server (Planner + health + reflection). Start() returns once every port is bound;
// Shutdown() stops accepting, drains in-flight RPCs and closes the store.
// Not thread-safe: Start, then Shutdown, from one thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "planner/daemon/daemon_options.h"

namespace grpc {
class Server;
}  // namespace grpc
namespace prometheus {
class Registry;
}  // namespace prometheus

namespace memplan {

class AdmissionWebhook;
class HttpsServer;
class MetricsServer;
class PlannerMetrics;
class PlannerStack;
class IntegrityMonitor;
class Store;
class WriteAuthorizer;

class PlannerDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<PlannerDaemon>> Start(const DaemonOptions& options);
  ~PlannerDaemon();  // Shutdown(0) when not shut down yet
  PlannerDaemon(const PlannerDaemon&) = delete;
  PlannerDaemon& operator=(const PlannerDaemon&) = delete;

  // "host:port" with the port actually bound.
  const std::string& listen_address() const { return listen_address_; }
  // Empty when the metrics endpoint is disabled.
  const std::string& metrics_address() const { return metrics_address_; }
  // Empty when the admission webhook is off.
  const std::string& webhook_address() const { return webhook_address_; }

  // Marks health NOT_SERVING, refuses new RPCs, waits up to grace_seconds for running ones
  // (then cancels them), drains the search executor and closes the store. Idempotent.
  void Shutdown(double grace_seconds);

 private:
  PlannerDaemon();

  std::string listen_address_;
  std::string metrics_address_;
  std::string webhook_address_;
  // Declared in construction order; Shutdown() releases them in reverse.
  std::unique_ptr<Store> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<PlannerMetrics> metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<WriteAuthorizer> authorizer_;  // outlives stack_, whose service asks it
  std::unique_ptr<PlannerStack> stack_;          // executor, core and service
  std::unique_ptr<AdmissionWebhook> webhook_;
  std::unique_ptr<HttpsServer> webhook_server_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<IntegrityMonitor> integrity_monitor_;  // reports to server_'s health service
};

}  // namespace memplan
