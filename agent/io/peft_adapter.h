// PEFT's LoRA adapter format: a directory with adapter_config.json (LoraConfig's fields) and
// adapter_model.safetensors, whose keys are the adapter parameters' names under PEFT's wrapper
// prefix "base_model.model." (model.layers.3.self_attn.q_proj.lora_A.weight becomes
// base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight). What peft's
// PeftModel.from_pretrained loads and save_pretrained writes; also the merge into the base.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/io/checkpoint.h"
#include "agent/model/lora_options.h"
#include "agent/core/param_residency.h"

namespace memplan::io {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";
inline constexpr char kPeftKeyPrefix[] = "base_model.model.";

struct PeftAdapter {
  LoraOptions lora;
  std::string base_model;           // base_model_name_or_path ("" when absent)
  std::vector<NamedParam> tensors;  // memplan names (prefix removed), CPU, stored dtype
};

// Writes `dir` (created if needed; both files replaced): LoRA config with task_type CAUSAL_LM,
// bias "none", and `adapters` (LlamaModel::TrainableParams() names) under the PEFT prefix.
// vision_language: the keys as PEFT names a Qwen2.5-VL's adapters, whose language model
// transformers 5 holds under model.language_model (ReadPeftAdapter reads both).
absl::Status SavePeftAdapter(const std::string& dir, const LoraOptions& lora,
                             const std::string& base_model,
                             const std::vector<NamedParam>& adapters,
                             bool vision_language = false);

// Reads a LoRA adapter. INVALID_ARGUMENT naming the config field for what memplan does not run:
// another peft_type, bias other than "none", rsLoRA, DoRA, fan_in_fan_out, per-layer rank or
// alpha patterns, layers_to_transform, modules_to_save, target_modules as a regular expression or
// outside q/k/v/o/gate/up/down_proj; and for keys without the PEFT prefix.
absl::StatusOr<PeftAdapter> ReadPeftAdapter(const std::string& dir);
// adapter_config.json alone, with the same refusals: lora and base_model, no tensors.
absl::StatusOr<PeftAdapter> ReadPeftConfig(const std::string& dir);

// The base parameters with every adapted weight replaced by W + (B A) * alpha / rank, as peft's
// merge_and_unload computes it (the product in fp32 for narrower weights, cast to W's dtype, then
// added). `base`: every base parameter by Hugging Face name; `adapters`: by memplan adapter name.
// INVALID_ARGUMENT when an adapter has no base weight or the shapes do not chain.
absl::StatusOr<std::vector<NamedParam>> MergeLora(const std::vector<NamedParam>& base,
                                                  const std::vector<NamedParam>& adapters,
                                                  const LoraOptions& lora);

// [LoRA checkpoints] A resumable LoRA run: the PEFT adapter files (so the checkpoint is also an
// adapter peft loads), optimizer.safetensors with the adapters' state in the checkpoint naming
// (agent/io/checkpoint.h) and trainer.json; the frozen base is not written (the run reloads it
// from its --model or --arch). Files are written in place, trainer.json last.
absl::Status SaveLoraCheckpoint(const std::string& dir, const TrainerState& trainer,
                                const LoraOptions& lora, const std::string& base_model,
                                const std::vector<NamedParam>& adapters,
                                const std::vector<NamedParam>& optimizer_state);
// True when `dir` holds an adapter_config.json (a LoRA checkpoint or a bare adapter).
bool IsLoraCheckpoint(const std::string& dir);
// params = the adapters (memplan names); the optimizer state is checked against them.
absl::StatusOr<Checkpoint> LoadLoraCheckpoint(const std::string& dir);

}  // namespace memplan::io
