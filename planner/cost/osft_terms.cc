#include "planner/cost/osft_terms.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/lora_shapes.h"
#include "common/param_shapes.h"
#include "common/status.h"

namespace memplan {

std::vector<std::string> OsftTargetModules(const TrainingMethod& training) {
  if (!training.osft_target_modules.empty()) return training.osft_target_modules;
  return std::vector<std::string>(kLoraModules.begin(), kLoraModules.end());
}

OsftWorkload OsftWorkloadFor(const TrainingMethod& training, DType param_dtype,
                             OptimizerKind optimizer, int32_t world_size) {
  OsftWorkload w;
  w.rank_ratio = training.osft_rank_ratio;
  w.targets = OsftTargetModules(training);
  w.dtype_bytes = DTypeBytes(param_dtype);
  w.optimizer = optimizer;
  w.world_size = std::max<int32_t>(1, world_size);
  return w;
}

absl::StatusOr<OsftBlockTerms> OsftBlockTermsFor(const ModelSpec& arch,
                                                 const TrainingMethod& training,
                                                 DType param_dtype) {
  // The optimizer and ranks do not change the per-block terms.
  ASSIGN_OR_RETURN(
      const OsftCost cost,
      EstimateOsftCost(arch, OsftWorkloadFor(training, param_dtype, OptimizerKind::kAdamW, 1)));
  const int64_t d = DTypeBytes(param_dtype);
  const auto blocks = static_cast<double>(std::max<int64_t>(arch.num_layers, 1));
  OsftBlockTerms t;
  t.extra_params = (cost.frozen_params + cost.trainable_params - cost.dense_params) /
                   std::max<int64_t>(arch.num_layers, 1);
  t.dense_forward_flops_per_token = cost.dense_forward_flops_per_token / blocks;
  t.forward_flops_per_token = cost.forward_flops_per_token / blocks;
  t.backward_flops_per_token = cost.backward_flops_per_token / blocks;
  // The split of each target of block 0, by the agent's rank rule on the model's own shapes.
  const std::vector<std::string> targets = OsftTargetModules(training);
  for (const ParamShape& p : HfParamShapes(arch)) {
    if (!absl::StartsWith(p.name, "model.layers.0.") || p.shape.size() != 2) continue;
    for (const std::string& module : targets) {
      if (!absl::EndsWith(p.name, absl::StrCat(".", module, ".weight"))) continue;
      const OsftRanks k = OsftSplitRanks(p.shape[0], p.shape[1], training.osft_rank_ratio);
      t.saved_bytes_per_token += 2 * d * k.low;
      t.largest_low_factor =
          std::max(t.largest_low_factor, std::max(p.shape[0], p.shape[1]) * k.low);
      t.transient_bytes_per_token =
          std::max(t.transient_bytes_per_token, 2 * d * std::max(k.high, k.low));
    }
  }
  return t;
}

}  // namespace memplan
