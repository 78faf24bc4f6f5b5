// LoraOptions: which projections of every transformer block get a LoRA adapter, and its rank,
// alpha and dropout, with PEFT's meaning (peft.LoraConfig: r, lora_alpha, lora_dropout,
// target_modules). Torch-free, so the CLI and the trainer validate flags without LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/lora_shapes.h"
#include "common/types.h"

namespace memplan {

// The projections an adapter can wrap, in Hugging Face's module order inside a block (the order
// of PEFT's named_parameters(), of LlamaModel::AdapterGroups() and of [LoRA adapter order]).
inline constexpr const auto& kLoraModuleNames = kLoraModules;

struct LoraOptions {
  int64_t rank = 0;    // 0: no adapters (full fine-tune)
  double alpha = 16;   // the update is scaled by alpha / rank (PEFT's `scaling`, no rsLoRA)
  double dropout = 0;  // on the adapter's input only, [0, 1)
  std::vector<std::string> targets;  // subset of kLoraModuleNames, any order, no repeats
  // QLoRA: the frozen base's projection weights in 4-bit NF4 ([QLoRA quantized weights],
  // common/nf4_bytes.h), dequantized per use (agent/quant). Needs rank > 0.
  bool nf4_base = false;

  bool enabled() const { return rank > 0; }
  double scaling() const { return alpha / static_cast<double>(rank); }
  bool Targets(absl::string_view module) const;
};

// "all" or a comma-separated list of kLoraModuleNames; INVALID_ARGUMENT naming `field`.
absl::StatusOr<std::vector<std::string>> ParseLoraTargetList(absl::string_view field,
                                                             absl::string_view text);
// Range checks (rank in [1, hidden_size], alpha > 0, dropout in [0, 1), known targets, none
// repeated, at least one); errors name `prefix` + the field and the allowed range.
absl::Status ValidateLoraOptions(const LoraOptions& lora, const ModelSpec& spec,
                                 absl::string_view prefix = "lora.");
// The planner's description of the same training method (kQlora with nf4_base).
TrainingMethod LoraTrainingMethod(const LoraOptions& lora);

}  // namespace memplan
