// Prometheus metrics of the planner daemon (names, units and label bounds:
// planner/metrics/README.md). Every method is cheap and may be called from any thread; plan_id
// label series are bounded to the newest Options::max_plan_series plans, older series are removed
// from the registry. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/metrics_server.h"  // MetricsServer, published with PlannerMetrics

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace memplan {

class PlannerMetrics {
 public:
  struct Options {
    // How many plans keep their memplan_plan_*_peak_bytes{plan_id} series (newest first).
    int max_plan_series = 256;
  };

  explicit PlannerMetrics(std::shared_ptr<prometheus::Registry> registry);
  PlannerMetrics(std::shared_ptr<prometheus::Registry> registry, const Options& options);
  ~PlannerMetrics();
  PlannerMetrics(const PlannerMetrics&) = delete;
  PlannerMetrics& operator=(const PlannerMetrics&) = delete;

  // One finished RPC: method e.g. "Plan", code e.g. "OK" / "INVALID_ARGUMENT".
  void ObserveRpc(absl::string_view method, absl::string_view code, double seconds);
  // Wall time of one plan search.
  void ObserveSearch(double seconds);
  // One plan answered to a client; `fits` is the verdict.
  void PlanServed(bool fits);
  // The predicted steady peak of a plan the planner handed out.
  void ObservePlanPrediction(absl::string_view plan_id, int64_t predicted_peak_bytes);
  // What a measurement's error is aggregated by (the calibration key): a handful of values each,
  // unlike plan_id.
  struct ErrorKey {
    std::string hardware;  // hardware name, e.g. "h100-80gb"
    std::string dtype;     // "bf16", "fp16", "fp32"
    std::string family;    // model family, e.g. "llama"
  };
  // A measured peak reported for a plan (not an OOM): sets both gauges and records the signed
  // relative error of common/relative_error.h, (predicted - measured) / measured, under `key`.
  // A non-positive measurement records no error.
  void ObserveMeasurement(absl::string_view plan_id, int64_t predicted_bytes,
                          int64_t measured_bytes, const ErrorKey& key = {});
  // A run of the plan that ran out of memory, reported at `unix_seconds` (the planner's clock):
  // counted in memplan_measurements_oom_total and stamped in memplan_last_oom_timestamp_seconds
  // under `key`, never observed as a relative error or a measured peak (what an OOM run reached
  // is a lower bound, not its peak). Sets the plan's predicted gauge only.
  void ObserveOom(absl::string_view plan_id, int64_t predicted_bytes, const ErrorKey& key,
                  double unix_seconds);
  // Number of measurements currently stored.
  void SetStoredMeasurements(int64_t n);
  // A write RPC refused by authorization: code "UNAUTHENTICATED" or "PERMISSION_DENIED".
  void RpcRejected(absl::string_view method, absl::string_view code);
  // An RPC refused before its handler ran: `reason` is one of a fixed set ("queue_full",
  // "shutting_down", "cancelled_in_queue", "search_queue_full", "undecodable").
  void RpcRefused(absl::string_view method, absl::string_view reason);
  // A measurement stored but kept out of calibration; `check` names the sanity check it failed
  // (a fixed, small set: PlannerCore's kQuarantine* names).
  void MeasurementQuarantined(absl::string_view check);

  // Number of plan_id values that currently have series (for tests and introspection).
  int TrackedPlanCount() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memplan
