// Layout-independent training checkpoints: a directory with model.safetensors (Hugging Face
// names, full tensors in the model dtype), config.json, optimizer.safetensors ("<name>.exp_avg",
// "<name>.exp_avg_sq", optional "<name>.master", "step") and trainer.json (trainer_state.h); an
// OSFT run's adds osft_config.json and osft_factors.safetensors ([OSFT checkpoints],
// osft_checkpoint.h).
// Written into a temporary sibling directory, fsynced and renamed into place, so a crash leaves
// either the previous checkpoint or the new one, never a mix. Nothing in it depends on the
// residency plan: a run may resume under a different plan.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/io/osft_checkpoint.h"
#include "agent/io/trainer_state.h"
#include "agent/core/param_residency.h"

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
  // [OSFT checkpoints] (osft_checkpoint.h) An OSFT run's split and every factor, CPU tensors in
  // OsftFactorShapes order (params then hold the merged weights). Empty otherwise.
  OsftCheckpoint osft;
};

// Checks `params` (deduplicated by tensor identity, first name kept) against
// HfParamShapes(trainer.model) — exact name set, shapes, dtype = trainer.param_dtype — and the
// optimizer state against the params (see ValidateOptimizerState), then writes `dir` atomically,
// replacing an existing checkpoint there. An existing `dir` that is neither empty nor a checkpoint
// is refused (FAILED_PRECONDITION), so a wrong path cannot destroy unrelated data. Empty
// `optimizer_state` writes no optimizer.safetensors (LoadCheckpoint then reads no state).
// [OSFT checkpoints] `osft` (checked by CheckOsftCheckpoint, osft_checkpoint.h) is written
// beside them, and the optimizer state may name its factors.
absl::Status SaveCheckpoint(const std::string& dir, const TrainerState& trainer,
                            const std::vector<NamedParam>& params,
                            const std::vector<NamedParam>& optimizer_state,
                            const OsftCheckpoint& osft = {});

// Reads and validates everything: trainer.json, the file sizes it records, both safetensors
// files, the parameter set against the model spec and the optimizer state against the params.
// A per-rank checkpoint (below) is assembled into whole tensors.
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

// [Per-rank checkpoints] A checkpoint saved by W ranks without gathering: besides trainer.json
// and config.json, one file per rank, rank-RRRRR-of-WWWWW.safetensors, holding 1-D pieces
// "<tensor>@<first element>" of the flattened parameters and optimizer state (the names above)
// that the rank stores; over the files every tensor is tiled exactly once. trainer.json lists
// every file with its size. Resumable by any world size, layout or plan: LoadCheckpoint()
// assembles whole tensors, CheckpointPieces reads just the ranges a rank stores.
std::string CheckpointShardFile(int rank, int world_size);
// The staging directory every rank writes into: a hidden sibling of `dir` named after the step
// and world size (the same on every rank; a failed attempt's leftovers are replaced).
std::string ShardedCheckpointStaging(const std::string& dir, int64_t step, int world_size);
// Rank 0, before any rank writes: refuses a `dir` that is neither absent, empty nor a
// checkpoint (FAILED_PRECONDITION), and makes `staged` afresh.
absl::Status BeginShardedCheckpoint(const std::string& dir, const std::string& staged);
// Every rank: its pieces (TensorPiece, agent/core/param_residency.h; any device, staged to the
// host one at a time) into `staged`, fsynced.
absl::Status WriteCheckpointShard(const std::string& staged, int rank, int world_size,
                                  const std::vector<TensorPiece>& pieces);
// Rank 0, after every rank wrote: checks that the pieces tile every parameter of trainer.model
// exactly (names, element counts, dtypes), writes config.json and trainer.json, and publishes
// `staged` as `dir` atomically (the previous checkpoint stays whole until the rename).
absl::Status FinishShardedCheckpoint(const std::string& staged, const std::string& dir,
                                     const TrainerState& trainer, int world_size);

// Reads a per-rank checkpoint's pieces by element range (positional reads of only the bytes
// asked for). Thread-compatible.
class CheckpointPieces {
 public:
  // Opens every shard file trainer.json lists (sizes checked) and indexes their pieces; DATA_LOSS
  // when a tensor's pieces overlap, leave a gap or disagree on the dtype.
  static absl::StatusOr<std::unique_ptr<CheckpointPieces>> Open(const std::string& dir);
  ~CheckpointPieces();
  const TrainerState& trainer() const;
  int world_size() const;  // of the run that saved it
  bool Has(const std::string& name) const;
  int64_t Numel(const std::string& name) const;  // -1 when absent
  // Elements [begin, begin + len) of `name`, in its stored dtype. NOT_FOUND when absent,
  // OUT_OF_RANGE when the range leaves it.
  absl::StatusOr<torch::Tensor> Read(const std::string& name, int64_t begin, int64_t len) const;

 private:
  struct Impl;
  explicit CheckpointPieces(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};
// Whether `dir`'s trainer.json lists per-rank files (false for any other or unreadable dir).
bool IsPerRankCheckpoint(const std::string& dir);

// torch::optim::AdamW state in the checkpoint naming, for the reference (unmanaged) path. Params
// without state yet are omitted; "step" is the common step (INTERNAL if params disagree).
absl::StatusOr<std::vector<NamedParam>> ExportAdamWState(torch::optim::AdamW& optimizer,
                                                         const std::vector<NamedParam>& params);
// Installs checkpoint state into `optimizer` for `params` (which must be in its param groups).
absl::Status ImportAdamWState(const std::vector<NamedParam>& optimizer_state,
                              const std::vector<NamedParam>& params,
                              torch::optim::AdamW& optimizer);

}  // namespace memplan::io
