// OsftOptions: orthogonal subspace fine-tuning (OSFT, "Sculpting Subspaces", Nayak et al. 2025) of
// chosen projections of every transformer block: each weight is split by SVD into a frozen
// high-singular part and a trainable low part ([OSFT] in agent/model/osft.h). Torch-free, so the
// CLI and the trainer validate flags without LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/osft_cost.h"  // OsftSplitRanks, the rank rule the planner prices
#include "common/types.h"

namespace memplan {

struct OsftOptions {
  // The fraction of each weight's spectrum that trains (mini_trainer's unfreeze_rank_ratio):
  // 0 = no OSFT; (0, 1) = OSFT, OsftSplitRanks() (common/osft_cost.h) says how many
  // directions each part keeps.
  double rank_ratio = 0;
  std::vector<std::string> targets;  // subset of kLoraModuleNames (agent/model/lora_options.h)

  bool enabled() const { return rank_ratio > 0; }
  bool Targets(absl::string_view module) const;
};

// Range checks (rank_ratio in (0, 1), known targets, none repeated, at least one; dense decoder
// projections only: no mixture-of-experts MLP, no vision tower); errors name `prefix` + the field.
absl::Status ValidateOsftOptions(const OsftOptions& osft, const ModelSpec& spec,
                                 absl::string_view prefix = "osft.");

}  // namespace memplan
