// OSFT (orthogonal subspace fine-tuning) as the agent runs it, torch-free: the rank split of a
// weight (the one rule agent/model/osft.h and the planner share) and the price of a run — the
// parameter counts and device bytes of its model states, the load-time SVD peak, the factorized
// projections' FLOPs against the dense ones, the gradient projection's FLOPs, the all-reduce bytes.
// The agent replaces each targeted projection W [out, in] (r = min(out, in)) by U [out, r],
// S [r], V [in, r] split at the rank ratio, and trains unmanaged: every rank holds the whole model
// (docs/cost-model.md, "OSFT"). Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/types.h"

namespace memplan {

// The split of a [out, in] weight, r = min(out, in): the frozen part keeps the
// high = clamp(floor((1 - rank_ratio) * r), 1, r - 1) largest singular directions, the trainable
// part the low = r - high others (rank_ratio: the fraction of the spectrum that trains).
struct OsftRanks {
  int64_t high = 0;
  int64_t low = 0;
};
OsftRanks OsftSplitRanks(int64_t out_features, int64_t in_features, double rank_ratio);

struct OsftWorkload {
  double rank_ratio = 0.5;
  std::vector<std::string> targets;  // kLoraModules names (common/lora_shapes.h)
  int64_t dtype_bytes = 2;           // the model dtype: parameters, factors, gradients
  OptimizerKind optimizer = OptimizerKind::kAdamW;  // adamw, adamw_bf16 or sgd (unmanaged)
  int world_size = 1;
};

struct OsftCost {
  int64_t dense_params = 0;      // the model before the split
  int64_t frozen_params = 0;     // high factors + every untargeted parameter
  int64_t trainable_params = 0;  // low factors (U, S, V)
  // Device bytes per rank: parameters, the low factors' gradients, the optimizer's state (torch
  // AdamW on the parameters: exp_avg and exp_avg_sq in the model dtype; SGD none).
  int64_t frozen_bytes = 0;
  int64_t trainable_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t model_state_bytes = 0;  // the four above
  // Load: the dense model is loaded, then split one weight at a time (its fp32 copy, U, S, Vᵀ
  // and the sign-fixed U, V in fp32 beside it; LAPACK's workspace not counted): the highest
  // device bytes of that sequence.
  int64_t load_peak_bytes = 0;
  // Per token, every block's targeted projections: forward FLOPs factorized and dense, and the
  // backward's (input gradient through every factor, weight gradient of the low ones only).
  double forward_flops_per_token = 0;
  double dense_forward_flops_per_token = 0;
  double backward_flops_per_token = 0;
  // Per step: projecting dU_low and dV_low (2 thin products each, per target).
  double projection_flops_per_step = 0;
  // Per step with world_size > 1: every low gradient all-reduced once, in the buckets of
  // OsftAllReduceBuckets (bytes crossing, all buckets together).
  int64_t allreduce_bytes_per_step = 0;
};

// [OSFT all-reduce buckets] With several ranks the low gradients are summed in buckets, each
// flattened into one buffer and all-reduced: the gradients in parameter order, a bucket closed
// before the one that would take it past `bucket_bytes` (a gradient larger than that is a bucket
// alone). One buffer of the whole gradient (9.25 GiB on llama-3.1-8b at ratio 0.5) found no free
// block among backward's freed activations and grew the cache by as much; a bucket of at most
// 256 MiB reuses them. Returns the index ranges [begin, end) of `bytes`. The agent's buckets and
// the planner's step-time transient (OsftBucketBufferBytes) both come from here.
inline constexpr int64_t kOsftAllReduceBucketBytes = int64_t{256} << 20;
std::vector<std::pair<size_t, size_t>> OsftAllReduceBuckets(const std::vector<int64_t>& bytes,
                                                             int64_t bucket_bytes);
// The largest bucket buffer for gradients of `total_bytes` whose largest is `largest_bytes`.
int64_t OsftBucketBufferBytes(int64_t total_bytes, int64_t largest_bytes, int64_t bucket_bytes);

// INVALID_ARGUMENT for a rank ratio outside (0, 1), an unknown or repeated target, a
// mixture-of-experts or vision model (dense decoders only, as the agent) or adamw8bit (it runs in
// the chunk manager, which OSFT does not use).
absl::StatusOr<OsftCost> EstimateOsftCost(const ModelSpec& model, const OsftWorkload& workload);

// The checks of a TrainingMethod of kind kOsft (ValidateTrainingMethod's, common/validate.h):
// osft_rank_ratio in (0, 1), osft_target_modules known and none repeated (empty: all), no LoRA
// fields, a dense decoder. INVALID_ARGUMENT names `prefix` + the field.
absl::Status ValidateOsftMethod(const TrainingMethod& method, const ModelSpec& model,
                                absl::string_view prefix);

}  // namespace memplan
