// Layout-independent training checkpoints: a directory with model.safetensors (Hugging Face
// names, full tensors in the model dtype), config.json, optimizer.safetensors ("<name>.exp_avg",
// "<name>.exp_avg_sq", optional "<name>.master", "step") and trainer.json (trainer_state.h).
// Written into a temporary sibling directory, fsynced and renamed into place, so a crash leaves
// either the previous checkpoint or the new one, never a mix. Nothing in it depends on the
// residency plan: a run may resume under a different plan.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/io/trainer_state.h"
#include "agent/model/param_residency.h"

namespace memplan::io {

// A checkpoint directory is also a Hugging Face checkpoint: config.json + model.safetensors load
// with transformers' from_pretrained (optimizer state and trainer.json are extra files to it).
inline constexpr char kCheckpointParamsFile[] = "model.safetensors";
inline constexpr char kCheckpointConfigFile[] = "config.json";
// Where checkpoints written before the Hugging Face layout keep their parameters (still read).
inline constexpr char kLegacyCheckpointParamsFile[] = "params.safetensors";
inline constexpr char kCheckpointOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kCheckpointTrainerFile[] = "trainer.json";

struct Checkpoint {
  TrainerState trainer;
  std::vector<NamedParam> params;           // CPU tensors, in HfParamShapes(model) order
  std::vector<NamedParam> optimizer_state;  // CPU tensors, as saved
};

// Checks `params` (deduplicated by tensor identity, first name kept) against
// HfParamShapes(trainer.model) — exact name set, shapes, dtype = trainer.param_dtype — and the
// optimizer state against the params (see ValidateOptimizerState), then writes `dir` atomically,
// replacing an existing checkpoint there. An existing `dir` that is neither empty nor a checkpoint
// is refused (FAILED_PRECONDITION), so a wrong path cannot destroy unrelated data.
absl::Status SaveCheckpoint(const std::string& dir, const TrainerState& trainer,
                            const std::vector<NamedParam>& params,
                            const std::vector<NamedParam>& optimizer_state);

// Reads and validates everything: trainer.json, the file sizes it records, both safetensors
// files, the parameter set against the model spec and the optimizer state against the params.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir);

// Optimizer state rules: names are "step" (an integer scalar, required when any other entry
// exists) or "<param>.exp_avg" / "<param>.exp_avg_sq" / "<param>.master" (floating, same shape as
// the param); a param has both moments or neither. Empty state is valid (fresh optimizer).
absl::Status ValidateOptimizerState(const std::vector<NamedParam>& params,
                                    const std::vector<NamedParam>& optimizer_state);

// Copies `source` values into `targets` by name (dtype converted, device kept, no autograd):
// every target tensor (deduplicated by identity; any of its names may match) must be found with
// the same shape and every source entry must be used. Validates before writing anything.
absl::Status CopyParamsByName(const std::vector<NamedParam>& source,
                              const std::vector<NamedParam>& targets);

// torch::optim::AdamW state in the checkpoint naming, for the reference (unmanaged) path. Params
// without state yet are omitted; "step" is the common step (INTERNAL if params disagree).
absl::StatusOr<std::vector<NamedParam>> ExportAdamWState(torch::optim::AdamW& optimizer,
                                                         const std::vector<NamedParam>& params);
// Installs checkpoint state into `optimizer` for `params` (which must be in its param groups).
absl::Status ImportAdamWState(const std::vector<NamedParam>& optimizer_state,
                              const std::vector<NamedParam>& params,
                              torch::optim::AdamW& optimizer);

}  // namespace memplan::io
