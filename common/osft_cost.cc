#include "common/osft_cost.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/lora_shapes.h"
#include "common/param_shapes.h"

namespace memplan {

OsftRanks OsftSplitRanks(int64_t out_features, int64_t in_features, double rank_ratio) {
  const int64_t r = std::min(out_features, in_features);
  OsftRanks ranks;
  if (r < 2) return ranks;
  const auto frozen = static_cast<int64_t>(std::floor((1.0 - rank_ratio) * static_cast<double>(r)));
  ranks.high = std::clamp<int64_t>(frozen, 1, r - 1);
  ranks.low = r - ranks.high;
  return ranks;
}

namespace {

// Whether `name` is "model.layers.<b>.<self_attn|mlp>.<module>.weight" for a targeted module.
bool IsTargetWeight(const std::string& name, const std::vector<std::string>& targets) {
  if (!absl::StartsWith(name, "model.layers.")) return false;
  for (const std::string& t : targets) {
    if (absl::EndsWith(name, absl::StrCat(".", t, ".weight"))) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<OsftCost> EstimateOsftCost(const ModelSpec& model, const OsftWorkload& w) {
  if (!(w.rank_ratio > 0 && w.rank_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("osft.rank_ratio = ", w.rank_ratio, "; allowed: 0 < ratio < 1"));
  }
  if (w.targets.empty()) return absl::InvalidArgumentError("osft.targets is empty");
  for (size_t i = 0; i < w.targets.size(); ++i) {
    if (std::find(kLoraModules.begin(), kLoraModules.end(), w.targets[i]) == kLoraModules.end()) {
      return absl::InvalidArgumentError(absl::StrCat("osft.targets has '", w.targets[i], "'"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (w.targets[j] == w.targets[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("osft.targets lists '", w.targets[i], "' twice"));
      }
    }
  }
  if (model.IsMoe() || model.IsVisionLanguage()) {
    return absl::InvalidArgumentError("osft: dense decoder models only");
  }
  if (w.optimizer == OptimizerKind::kAdamW8bit) {
    return absl::InvalidArgumentError("osft: adamw8bit runs in the chunk manager; OSFT does not");
  }
  if (w.dtype_bytes <= 0 || w.world_size < 1) {
    return absl::InvalidArgumentError("osft: dtype_bytes and world_size must be positive");
  }
  OsftCost c;
  const std::vector<ParamShape> shapes = HfParamShapes(model);
  int64_t dense_bytes = 0;
  for (const ParamShape& p : shapes) dense_bytes += p.numel() * w.dtype_bytes;
  // The split's sequence ([Load] above): resident bytes grow by (factors - weight) per target.
  int64_t resident = dense_bytes;
  c.load_peak_bytes = dense_bytes;
  for (const ParamShape& p : shapes) {
    c.dense_params += p.numel();
    if (!IsTargetWeight(p.name, w.targets)) {
      c.frozen_params += p.numel();
      continue;
    }
    const int64_t out = p.shape[0];
    const int64_t in = p.shape[1];
    const int64_t r = std::min(out, in);
    const OsftRanks k = OsftSplitRanks(out, in, w.rank_ratio);
    c.frozen_params += k.high * (out + in + 1);
    c.trainable_params += k.low * (out + in + 1);
    const int64_t fp32_transient = 4 * (out * in + 2 * (out * r + in * r) + r);
    c.load_peak_bytes = std::max(c.load_peak_bytes, resident + fp32_transient +
                                                        r * (out + in + 1) * w.dtype_bytes);
    resident += (r * (out + in + 1) - out * in) * w.dtype_bytes;
    const auto kh = static_cast<double>(k.high);
    const auto kl = static_cast<double>(k.low);
    const auto o = static_cast<double>(out);
    const auto i = static_cast<double>(in);
    // x·V (in x k), scale by S (k), ·Uᵀ (k x out): 2 FLOPs per multiply-add.
    const double high_fwd = 2.0 * kh * (i + o) + kh;
    const double low_fwd = 2.0 * kl * (i + o) + kl;
    c.forward_flops_per_token += high_fwd + low_fwd;
    c.dense_forward_flops_per_token += 2.0 * i * o;
    // Input gradient through both parts (as their forward); weight gradients of U_low, V_low and
    // S_low (as the low forward once more).
    c.backward_flops_per_token += high_fwd + 2.0 * low_fwd;
    c.projection_flops_per_step += 2.0 * 2.0 * kh * kl * (o + i);
  }
  c.load_peak_bytes = std::max(c.load_peak_bytes, resident);
  c.frozen_bytes = c.frozen_params * w.dtype_bytes;
  c.trainable_bytes = c.trainable_params * w.dtype_bytes;
  c.grad_bytes = c.trainable_bytes;
  const int64_t moments = w.optimizer == OptimizerKind::kSgd ? 0 : 2;
  c.optimizer_state_bytes = moments * c.trainable_bytes;
  c.model_state_bytes = c.frozen_bytes + c.trainable_bytes + c.grad_bytes + c.optimizer_state_bytes;
  c.allreduce_bytes_per_step = w.world_size > 1 ? c.grad_bytes : 0;
  return c;
}

std::vector<std::pair<size_t, size_t>> OsftAllReduceBuckets(const std::vector<int64_t>& bytes,
                                                             int64_t bucket_bytes) {
  std::vector<std::pair<size_t, size_t>> buckets;
  size_t begin = 0;
  int64_t filled = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i > begin && filled + bytes[i] > bucket_bytes) {
      buckets.emplace_back(begin, i);
      begin = i;
      filled = 0;
    }
    filled += bytes[i];
  }
  if (begin < bytes.size()) buckets.emplace_back(begin, bytes.size());
  return buckets;
}

int64_t OsftBucketBufferBytes(int64_t total_bytes, int64_t largest_bytes, int64_t bucket_bytes) {
  return std::min(total_bytes, std::max(bucket_bytes, largest_bytes));
}

absl::Status ValidateOsftMethod(const TrainingMethod& t, const ModelSpec& m,
                                absl::string_view prefix) {
  if (!(t.osft_rank_ratio > 0 && t.osft_rank_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "osft_rank_ratio = ", t.osft_rank_ratio,
                     " is out of range; allowed (0, 1), the fraction of each weight's spectrum "
                     "that trains"));
  }
  const std::string allowed = absl::StrJoin(kLoraModules, ", ");
  for (size_t i = 0; i < t.osft_target_modules.size(); ++i) {
    const std::string& name = t.osft_target_modules[i];
    if (std::find(kLoraModules.begin(), kLoraModules.end(), name) == kLoraModules.end()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "osft_target_modules has \"", name,
                                                     "\"; allowed: ", allowed));
    }
    if (std::find(t.osft_target_modules.begin(), t.osft_target_modules.begin() + i, name) !=
        t.osft_target_modules.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "osft_target_modules lists \"", name, "\" twice"));
    }
  }
  if (t.lora_rank != 0 || !t.lora_target_modules.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "lora_rank and ", prefix,
        "lora_target_modules must be unset for kind OSFT (the agent does not run LoRA together "
        "with OSFT)"));
  }
  if (m.IsMoe() || m.IsVisionLanguage()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "kind = OSFT needs a dense decoder model; \"", m.family, "\"",
                     m.IsMoe() ? " is a mixture of experts" : " is a vision-language model",
                     " (the agent splits dense decoder projections only)"));
  }
  return absl::OkStatus();
}

}  // namespace memplan
