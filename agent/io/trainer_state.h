// trainer.json of a checkpoint: the trainer's position (optimizer step, data position, seeds),
// the optimizer hyper-parameters, the model spec and the sizes of the checkpoint's files.
// Layout-independent: nothing here depends on the residency plan the state was saved under.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/types.h"

namespace memplan::io {

struct OptimizerHyperParams {
  std::string kind = "adamw";  // OptimizerName(): "adamw", "adamw_bf16", "sgd"
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct TrainerState {
  int64_t step = 0;           // optimizer steps completed
  int64_t data_position = 0;  // micro-batches consumed: the next TokenBatcher step
  uint64_t data_seed = 0;     // TokenBatcherOptions::seed
  uint64_t rng_seed = 0;      // seed of Torch's generator (initialisation)
  double max_grad_norm = 0;   // 0 = no clipping
  OptimizerHyperParams optimizer;
  ModelSpec model;
  DType param_dtype = DType::kFloat32;
  Workload workload;
  std::string plan_id;  // the plan the run used when saving (informational)
};

// The whole trainer.json document.
struct CheckpointManifest {
  TrainerState trainer;
  std::map<std::string, int64_t> file_size_bytes;  // checkpoint file name -> exact size
};

inline constexpr char kCheckpointFormat[] = "memplan-checkpoint";
inline constexpr int kCheckpointVersion = 1;

std::string EncodeCheckpointManifest(const CheckpointManifest& manifest);
// INVALID_ARGUMENT naming the JSON key for anything missing, mistyped or out of range (the model
// spec passes ValidateModelSpec, workload ValidateWorkload, file names are plain names).
absl::StatusOr<CheckpointManifest> DecodeCheckpointManifest(absl::string_view json);

}  // namespace memplan::io
