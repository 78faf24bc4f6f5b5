// Input validation shared by the planner and the agent. Each error is INVALID_ARGUMENT and
// names the field (with the caller's prefix, e.g. "arch.num_heads") and the allowed range.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "common/types.h"

namespace memplan {

// Hard bounds: anything outside is rejected as absurd rather than planned.
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 17;         // 131072
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 16;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;
inline constexpr int32_t kMaxWorldSize = 1 << 16;
inline constexpr int32_t kMaxGradAccum = 1 << 16;
inline constexpr int64_t kMaxGpuMemoryBytes = int64_t{1} << 44;  // 16 TiB
inline constexpr int64_t kMaxHostMemoryBytes = int64_t{1} << 50;
inline constexpr double kMaxRate = 1e18;  // bytes/s, FLOP/s or params/s

absl::Status ValidateModelSpec(const ModelSpec& m, absl::string_view prefix);

// INVALID_ARGUMENT when a sequence of seq_len tokens would make `m`'s sliding-window attention
// (ModelSpec::sliding_window) differ from the full causal attention the agent computes; names
// config.json's "sliding_window".
absl::Status CheckSequenceLength(const ModelSpec& m, int64_t seq_len);
absl::Status ValidateWorkload(const Workload& w, absl::string_view prefix);
absl::Status ValidateHardwareSpec(const HardwareSpec& h, absl::string_view prefix);
absl::Status ValidateTrainingMethod(const TrainingMethod& t, const ModelSpec& m,
                                    absl::string_view prefix);

}  // namespace memplan
