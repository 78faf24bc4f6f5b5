// PlannerClient: the agent's torch-free gRPC client of memplan.v1.Planner behind plain structs
// (common/types.h, agent/client/plan_answer.h). Retries UNAVAILABLE (and DEADLINE_EXCEEDED for
// calls that are safe to repeat) with exponential backoff, then fails naming the address.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/client/plan_answer.h"
#include "common/channel_security.h"
#include "common/types.h"

namespace memplan {

struct PlannerClientOptions {
  int retries = 4;                        // attempts after the first one
  double initial_backoff_seconds = 0.25;  // wait before the first retry
  double max_backoff_seconds = 4.0;       // the wait doubles up to this
  double call_deadline_seconds = 30.0;    // per attempt
  // How the client waits between attempts; empty = really sleep. Tests pass a fake.
  std::function<void(double seconds)> sleep;
  // TLS / mutual TLS and the bearer token (memplan-agent's --tls-* and --auth-token-file).
  ChannelSecurityOptions security;
};

// Thread-safe: calls may come from several threads; they share one channel.
class PlannerClient {
 public:
  // Validates the options, reads the certificate and token files (INVALID_ARGUMENT naming the
  // flag) and builds the channel lazily; never contacts the planner here.
  // `address` is a gRPC target, e.g. "127.0.0.1:50051" or "dns:///planner:50051".
  static absl::StatusOr<std::unique_ptr<PlannerClient>> Create(const std::string& address,
                                                               const PlannerClientOptions& options);
  ~PlannerClient();
  PlannerClient(const PlannerClient&) = delete;
  PlannerClient& operator=(const PlannerClient&) = delete;

  const std::string& address() const;

  // Asks for a residency plan. INVALID_ARGUMENT (client side) unless exactly one model source and
  // one hardware source are set; planner errors come back with its code and message.
  absl::StatusOr<PlanAnswer> Plan(const PlanQuery& query);
  // Stores a profiled trace; returns its id.
  absl::StatusOr<std::string> SubmitTrace(const Trace& trace);
  // Stores a measured hardware profile; returns its id.
  absl::StatusOr<std::string> SubmitHardwareProfile(const HardwareSpec& hardware);
  // Reports what a run of plan measurement.plan_id measured. Retried on UNAVAILABLE only: a
  // deadline that expired after the planner stored it would otherwise count the sample twice.
  absl::StatusOr<MeasurementReceipt> ReportMeasurement(const Measurement& measurement);

  class Impl;

 private:
  explicit PlannerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memplan
