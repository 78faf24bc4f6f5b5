// [OSFT checkpoints] An OSFT run (agent/model/osft.h) saves the checkpoint of a full fine-tune —
// model.safetensors under Hugging Face names, each split projection's weight merged back from its
// factors in the model dtype, so transformers loads the directory as an ordinary model — plus two
// files: osft_config.json (the rank ratio and the targets) and osft_factors.safetensors (every
// factor as it trains, the frozen high ones and the low ones). optimizer.safetensors holds the low
// factors' state. A resume restores the factors themselves (the merged weights would not split
// back into them) and the untargeted parameters from model.safetensors.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/param_residency.h"
#include "agent/core/torch_pch.h"
#include "agent/model/osft.h"
#include "common/param_shapes.h"
#include "common/types.h"

namespace memplan::io {

inline constexpr char kOsftConfigFile[] = "osft_config.json";
inline constexpr char kOsftFactorsFile[] = "osft_factors.safetensors";

// How an OSFT run split its weights (agent/model/osft_options.h); rank_ratio 0: not an OSFT run.
struct OsftSettings {
  double rank_ratio = 0;
  std::vector<std::string> targets;  // kLoraModules names (common/lora_shapes.h)
  bool enabled() const { return rank_ratio > 0; }
};

// What an OSFT checkpoint holds beside the full fine-tune's files; empty for any other run.
struct OsftCheckpoint {
  OsftSettings settings;
  std::vector<NamedParam> factors;  // CPU tensors, OsftFactorShapes order once checked
};

// The factors of `osft`'s split of `model`: per block, its targeted projections in Hugging Face
// order, each as "<module path>.osft_{u,s,v}_high" then "..._low" (the names of OsftFrozenNamed
// and OsftTrainableNamed), U [out, k], S [k], V [in, k] with k from OsftSplitRanks
// (common/osft_cost.h). Empty when `osft` is not enabled.
std::vector<ParamShape> OsftFactorShapes(const ModelSpec& model, const OsftSettings& osft);

// Checks `osft` for a checkpoint of `model` in `dtype`: the settings (ratio in (0, 1), known
// targets, none twice) and the factors against OsftFactorShapes — the exact name set, shapes,
// dtype — and returns the factors in that order. INVALID_ARGUMENT naming the problems; also for
// factors without settings. Empty for empty `osft`.
absl::StatusOr<std::vector<NamedParam>> CheckOsftCheckpoint(const ModelSpec& model, DType dtype,
                                                            const OsftCheckpoint& osft);

// The dense weight the factors stand for, W = U_high diag(S_high) V_highᵀ + U_low diag(S_low)
// V_lowᵀ [out, in], computed in fp32 on the factors' device and returned in `dtype`.
torch::Tensor OsftMergedWeight(const OsftFactors& f, torch::ScalarType dtype);

// An OSFT model's tensors by name (its frozen parameters, the high factors among them, and the
// low factors), split into what its checkpoint holds: `params`, the Hugging Face parameters, each
// split projection's "<path>.weight" merged from its factors (OsftMergedWeight, in `dtype`), and
// `factors`, the factors as they are; all CPU copies. INVALID_ARGUMENT for a projection that
// lacks some of its six factors.
struct OsftCheckpointParts {
  std::vector<NamedParam> params;
  std::vector<NamedParam> factors;
};
absl::StatusOr<OsftCheckpointParts> SplitOsftCheckpointParts(const std::vector<NamedParam>& named,
                                                             torch::ScalarType dtype);

// Writes osft_config.json and osft_factors.safetensors into `dir` (fsynced; the checkpoint's
// writer lists them in trainer.json). Nothing for empty `osft`. Returns the file names written.
absl::StatusOr<std::vector<std::string>> WriteOsftFiles(const std::string& dir,
                                                        const OsftCheckpoint& osft);
// Reads them back (unchecked: CheckOsftCheckpoint); empty when `dir` has no osft_config.json.
absl::StatusOr<OsftCheckpoint> ReadOsftFiles(const std::string& dir);
// osft_config.json alone (checked); not enabled when `dir` has none.
absl::StatusOr<OsftSettings> ReadOsftSettings(const std::string& dir);

// Whether a run that splits at `rank_ratio` (0: no OSFT) over `targets` may resume a checkpoint
// whose split is `saved`: the same ratio and the same set of targets, or neither OSFT.
// FAILED_PRECONDITION naming the flag and what to pass otherwise.
absl::Status CheckOsftResume(const OsftSettings& saved, double rank_ratio,
                             const std::vector<std::string>& targets);

}  // namespace memplan::io
