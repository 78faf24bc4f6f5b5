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
// The node a job runs on, where it differs from the hardware preset's: --gpus-per-node (the
// workload's local_world_size: ranks per node sharing its RAM and CPU; --local-world-size is the
// same flag) and --host-memory-gib (the request's host_memory_bytes, CheckHostMemoryOverride's
// range, fractions allowed).
inline constexpr IntFlagSpec kGpusPerNodeFlag = {"--gpus-per-node", 1, kMaxWorldSize};
inline constexpr absl::string_view kLocalWorldSizeAlias = "--local-world-size";
inline constexpr DoubleFlagSpec kHostMemoryGibFlag = {
    "--host-memory-gib",
    {static_cast<double>(kMinHostMemoryGiB), static_cast<double>(kMaxHostMemoryGiB)}};
// Registers both flags (and the alias): *gpus_per_node as given, *host_memory_bytes in bytes.
void AddNodeFlags(FlagSet* flags, std::optional<int32_t>* gpus_per_node,
                  std::optional<int64_t>* host_memory_bytes);
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
// HOST_MEMORY_PINNED, any case), --persistent-state and --persistent-params sharded|replicated,
// --head-chunk-mib N in [1, 4096] (head_chunk_logit_bytes, common/head_chunking.h).
void AddFixedKnobFlags(FlagSet* flags, FixedKnobs* knobs, int32_t min_n_buffer = 0);

}  // namespace memplan
