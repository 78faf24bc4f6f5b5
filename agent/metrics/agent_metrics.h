// Live metrics of one memplan-agent training run, served on an optional HTTP port (GET /metrics,
// common/metrics_server.h) so that a sidecar Prometheus scrape shows the planner's prediction
// next to what the run measures while it runs. Torch-free: the training loop passes plain
// numbers. Every series carries the run's plan_id (one per process: bounded). Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace memplan {

// What the planner predicted for the plan this run applies (zeros when it ran offline).
struct AgentPlanInfo {
  std::string plan_id;  // empty: "none"
  int64_t predicted_peak_bytes = 0;
  double predicted_step_seconds = 0;
  double predicted_tokens_per_second = 0;
};

// One optimizer step as the training loop measured it.
struct AgentStepSample {
  double seconds = 0;
  double tokens_per_second = 0;
  int64_t allocated_bytes = 0;  // device allocator, after the step
  int64_t reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0;  // during the step
  int64_t peak_reserved_bytes = 0;
  int64_t chunk_upload_bytes = 0;  // host -> device chunk bytes moved in this step
  double loss = 0;                 // the step's training loss (NaN/inf kept as they are)
  int64_t step = 0;                // optimizer steps of the run so far, a resumed run's included
};

class AgentMetrics {
 public:
  // Serves on `address` ("HOST:PORT", port 0 picks one). UNAVAILABLE naming the address when it
  // cannot listen.
  static absl::StatusOr<std::unique_ptr<AgentMetrics>> Start(const std::string& address);
  ~AgentMetrics();
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  int port() const;

  // Sets the prediction gauges and the plan_id of every series; call before ObserveStep.
  void SetPlan(const AgentPlanInfo& plan);
  void ObserveStep(const AgentStepSample& step);

 private:
  struct Impl;
  explicit AgentMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memplan
