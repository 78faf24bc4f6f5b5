// OSFT's per-block terms for the analytic trace and the planner's price of an OSFT run, read
// from common/osft_cost.h (EstimateOsftCost, OsftSplitRanks: the agent's rules) so that no
// formula of the split is written twice (docs/cost-model.md, "OSFT"). Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/osft_cost.h"
#include "common/types.h"

namespace memplan {

// The projections `training` splits: its osft_target_modules, or all seven when empty.
std::vector<std::string> OsftTargetModules(const TrainingMethod& training);

// The common/osft_cost.h workload of a planned OSFT run.
OsftWorkload OsftWorkloadFor(const TrainingMethod& training, DType param_dtype,
                             OptimizerKind optimizer, int32_t world_size);

// One transformer block's OSFT terms (every block of a dense decoder is the same).
struct OsftBlockTerms {
  // [OSFT saved factors] Per token, what the factorized projections keep for backward beyond the
  // dense ones: each target's low part keeps x·V_low and (x·V_low)·S_low ([rows, k_low] each, the
  // inputs of S_low's and U_low's weight gradients); the frozen high part keeps none (autograd
  // saves an operand only for the gradient of a tensor that needs one, and x is already kept).
  int64_t saved_bytes_per_token = 0;
  // Per token, the widest target's two [rows, k] intermediates alive while its product forms.
  int64_t transient_bytes_per_token = 0;
  // Elements of the block's largest low factor (U_low or V_low): what one torch AdamW update
  // allocates its temporaries by.
  int64_t largest_low_factor = 0;
  // Parameters of the block's factors less those of the weights they replace (elements).
  int64_t extra_params = 0;
  // Per token: the targets' dense forward FLOPs, and factorized forward and backward FLOPs.
  double dense_forward_flops_per_token = 0;
  double forward_flops_per_token = 0;
  double backward_flops_per_token = 0;
};
absl::StatusOr<OsftBlockTerms> OsftBlockTermsFor(const ModelSpec& arch,
                                                 const TrainingMethod& training, DType param_dtype);

}  // namespace memplan
