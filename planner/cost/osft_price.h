// The price of an OSFT run as the agent runs it ([OSFT] in agent/model/osft.h): unmanaged, every
// parameter on the device of every rank, no chunks; only the blocks' modes (checkpointing,
// hidden-state offload, swap) vary. Model states from common/osft_cost.h, the activation walk and
// the blocks' times from the cost model over the OSFT analytic trace (docs/cost-model.md,
// "OSFT"). Thread-safe after construction (const methods only).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/osft_cost.h"
#include "common/types.h"
#include "planner/cost/cost_model.h"

namespace memplan {

class OsftPricer {
 public:
  // `trace`: SynthesizeTrace's for a TrainingKind::kOsft method. INVALID_ARGUMENT for another
  // kind or what EstimateOsftCost refuses (adamw8bit, ratio, targets).
  static absl::StatusOr<OsftPricer> Create(const Trace& trace, const HardwareSpec& hardware,
                                           const CostOptions& options);

  int32_t num_blocks() const { return walk_->num_blocks(); }
  const OsftCost& cost() const { return cost_; }
  // The plan the agent runs: no chunk knobs (every parameter resident), arranged block modes.
  ResidencyPlan MakePlan(const ModeCounts& counts) const;
  // Every Prediction field for `counts` (n_swap + n_hs_offload + n_checkpoint <= num_blocks()).
  Prediction Predict(const ModeCounts& counts) const;
  // Seconds of the step beside forward and backward, before the time factor: the optimizer's
  // update of the low factors, the gradient projection and (several ranks) the all-reduce.
  double StepSeconds() const { return step_seconds_; }

 private:
  OsftPricer() = default;

  // The activation walk and block times: the trace with nothing trainable in chunks, one rank.
  // Shared and never null after Create() (an optional here trips GCC 13's -Wmaybe-uninitialized
  // at -O3 where a StatusOr<OsftPricer> is moved).
  std::shared_ptr<const CostModel> walk_;
  OsftCost cost_;
  CostOptions options_;
  int32_t world_size_ = 1;
  int64_t largest_low_factor_bytes_ = 0;
  int64_t block_grad_bytes_ = 0;
  int64_t tokens_per_step_ = 0;
  double step_seconds_ = 0;
};

}  // namespace memplan
