// MakePlan and PredictPlan for an OSFT method (TrainingKind::kOsft): the agent runs OSFT
// unmanaged, so the only plans are the blocks' modes over an all-resident model
// (planner/cost/osft_price.h); the best is the fastest that fits, else the leanest is shown.
// Pure computation. Thread-safe: free functions over value inputs.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "planner/core/plan_engine.h"
#include "planner/cost/cost_model.h"

namespace memplan {

// What MakePlan derived from the inputs (validated by it) and shares with the OSFT plans.
struct OsftPlanContext {
  CostOptions cost_options;
  int64_t capacity_bytes = 0;       // usable device bytes after the margin
  int64_t host_bytes_per_rank = 0;  // the host memory a rank may use
  std::string usable_text;          // "X GiB usable (...)" for the reasons
  std::string host_limit_text;
};

absl::StatusOr<PlanOutcome> MakeOsftPlan(const PlanInputs& in, const OsftPlanContext& context);
absl::StatusOr<Prediction> PredictOsftPlan(const PlanInputs& in, const OsftPlanContext& context,
                                           const ResidencyPlan& plan);

}  // namespace memplan
