// The flags that set a Plan request's fields, for every binary that takes them (`memplan plan` and
// `admit`, `memplan-agent train` and `profile`, memplan-train-bench, memplan-hf-parity): each name
// and range declared here once, the ranges those the request's validation applies
// (common/validate.h, common/safety_margin.h), the knob names FixedKnobTable's.
#pragma once

#include <optional>
#include <string>

#include "common/flags.h"
#include "common/safety_margin.h"
#include "common/types.h"
#include "common/validate.h"

namespace memplan {

inline constexpr IntFlagSpec kBatchFlag = {"--batch", 1, kMaxMicroBatch};
inline constexpr IntFlagSpec kSeqFlag = {"--seq", 1, kMaxSeqLen};
inline constexpr IntFlagSpec kGradAccumFlag = {"--grad-accum", 1, kMaxGradAccum};
inline constexpr IntFlagSpec kLoraRankFlag = {"--lora-rank", 1, kMaxLoraRank};
// 0: the planner's default (ResolveSafetyMargin).
inline constexpr DoubleFlagSpec kSafetyMarginFlag = {"--safety-margin",
                                                     {kMinSafetyMargin, kMaxSafetyMargin}};
// --chunk-mib: kMinChunkBytes to kMaxChunkBytes in MiB.
inline constexpr IntFlagSpec kChunkMibFlag = {"--chunk-mib", kMinChunkBytes >> 20,
                                              kMaxChunkBytes >> 20};

// --dtype fp32|bf16|fp16 (ParseDType's spellings, any case).
void AddDTypeFlag(FlagSet* flags, absl::string_view name, std::optional<DType>* out);
// --optimizer adamw|adamw_bf16|sgd|adamw8bit; the string form keeps the name as given.
void AddOptimizerFlag(FlagSet* flags, std::optional<OptimizerKind>* out);
void AddOptimizerFlag(FlagSet* flags, std::string* out);
// --lora-targets: a comma list of common/lora_shapes.h's kLoraModules, or "all".
void AddLoraTargetsFlag(FlagSet* flags, std::vector<std::string>* out);

// Every fixed knob's flag (FixedKnobTable's names) into `knobs`: --chunk-mib N (kChunkMibFlag),
// --n-persist and --n-buffer in [0, kMaxChunkCount] (n_buffer from `min_n_buffer`), --n-swap,
// --n-ckpt and --n-hs-offload in [0, kMaxLayers], --host-memory pinned|pageable (also
// HOST_MEMORY_PINNED, any case), --persistent-state and --persistent-params sharded|replicated.
void AddFixedKnobFlags(FlagSet* flags, FixedKnobs* knobs, int32_t min_n_buffer = 0);

}  // namespace memplan
