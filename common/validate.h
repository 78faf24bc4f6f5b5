// Input validation shared by the planner and the agent. Each error is INVALID_ARGUMENT and
// names the field (with the caller's prefix, e.g. "arch.num_heads") and the allowed range.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/types.h"

namespace memplan {

// Hard bounds: anything outside is rejected as absurd rather than planned.
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 17;         // 131072
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxHeads = 4096;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;
inline constexpr int64_t kMaxExperts = 1024;  // routed experts per sparse layer
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 16;
// A vision-language workload's images per sample (Workload::images_per_sample).
inline constexpr int64_t kMaxImagesPerSample = 1024;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;
inline constexpr int32_t kMaxWorldSize = 1 << 16;
inline constexpr int32_t kMaxGradAccum = 1 << 16;
inline constexpr int64_t kMaxGpuMemoryBytes = int64_t{1} << 44;  // 16 TiB
inline constexpr int64_t kMaxHostMemoryBytes = int64_t{1} << 50;
inline constexpr double kMaxRate = 1e18;  // bytes/s, FLOP/s or params/s
// A LoRA rank: at most the model's hidden_size (ValidateTrainingMethod), and never above this
// (the bound of the --lora-rank flags, which do not know the model yet).
inline constexpr int64_t kMaxLoraRank = int64_t{1} << 16;
// The fixed knobs (FixedKnobs): a chunk's size, and the chunk counts n_persist / n_buffer before
// the planner narrows them to the layout's chunk count (the block counts n_swap, n_checkpoint,
// n_hs_offload are at most kMaxLayers, then the model's layers).
inline constexpr int64_t kMinChunkBytes = int64_t{1} << 20;
inline constexpr int64_t kMaxChunkBytes = int64_t{16} << 30;
inline constexpr int32_t kMaxChunkCount = 1 << 20;
// A Plan request's max_alternatives (0: the planner's default).
inline constexpr int32_t kMaxAlternatives = 20;
// An Admit request: its pools and each pool's GPUs.
inline constexpr int32_t kMaxAdmitPools = 64;
inline constexpr int32_t kMaxPoolGpus = 1'000'000;
// A ListPlans request's page_size (0: the planner's default).
inline constexpr int32_t kMaxListPlansPageSize = 1000;
// A reported Measurement: its byte fields (host-side figures can exceed any GPU's memory) and
// its step time.
inline constexpr int64_t kMaxMeasuredBytes = kMaxHostMemoryBytes;
inline constexpr double kMaxStepSeconds = 1e7;
// A Plan request's host_memory_bytes, the node's RAM in place of the hardware's (0: the
// hardware's), in GiB as the --host-memory-gib flags take it.
inline constexpr int64_t kMinHostMemoryGiB = 1;
inline constexpr int64_t kMaxHostMemoryGiB = 65536;

// Bounds on the strings and lists a client sends: every one is stored or echoed, and Plan and
// Admit need no credentials. Errors name the field and the bound and quote at most
// kMaxQuotedBytes of the value (Quote).
inline constexpr size_t kMaxNameBytes = 256;   // model, hardware, pool and preset names, families
inline constexpr size_t kMaxIdBytes = 128;     // plan, trace and profile ids, page tokens
inline constexpr size_t kMaxNoteBytes = 4096;  // a measurement's free-text note
inline constexpr size_t kMaxLoraTargetModules = 16;
inline constexpr size_t kMaxChunkEntries = size_t{1} << 16;  // a trace's chunk_param_bytes
inline constexpr size_t kMaxQuotedBytes = 64;

// `value` in double quotes for an error message: whole when at most kMaxQuotedBytes, else its
// first kMaxQuotedBytes followed by "... (N bytes)".
std::string Quote(absl::string_view value);
// One check per kind of field; `field` is the full name, e.g. "arch.name" or "pools[2].name".
absl::Status CheckName(absl::string_view field, absl::string_view value);
absl::Status CheckId(absl::string_view field, absl::string_view value);
absl::Status CheckNote(absl::string_view field, absl::string_view value);
absl::Status CheckListSize(absl::string_view field, size_t size, size_t max_size);

// m.name is not bounded here (a checkpoint may carry a long path); the planner bounds arch.name.
absl::Status ValidateModelSpec(const ModelSpec& m, absl::string_view prefix);

// INVALID_ARGUMENT for a sequence length out of [1, kMaxSeqLen], or a sliding window `m` cannot
// run with (ValidateModelSpec's rules; the message names config.json's "sliding_window"). Any
// length beyond the window is fine: the agent computes sliding-window attention exactly.
absl::Status CheckSequenceLength(const ModelSpec& m, int64_t seq_len);
absl::Status ValidateWorkload(const Workload& w, absl::string_view prefix);
// A workload's images against the model: a vision-language model (ModelSpec::IsVisionLanguage)
// needs images_per_sample >= 1 (never priced as text only), a text model takes none.
// INVALID_ARGUMENT names `workload_prefix`images_per_sample.
absl::Status ValidateImagesForModel(const ModelSpec& m, const Workload& w,
                                    absl::string_view arch_prefix,
                                    absl::string_view workload_prefix);
// Also bounds h.name (CheckName).
absl::Status ValidateHardwareSpec(const HardwareSpec& h, absl::string_view prefix);
// Mixtures of experts train fully or with adapters on the attention projections only: QLoRA and
// adapters on gate_proj/up_proj/down_proj (which a sparse layer's experts replace) are refused.
absl::Status CheckMoeAdapters(const ModelSpec& m, bool nf4_base,
                              const std::vector<std::string>& targets, absl::string_view prefix);
// Vision-language models (qwen2_5_vl) take adapters on the language model's attention projections
// only: PEFT's gate_proj/up_proj/down_proj also name the vision tower's MLP
// (visual.blocks.N.mlp.*), whose adapters are not implemented, and QLoRA is not implemented for
// them; both are refused rather than trained differently from PEFT.
absl::Status CheckVisionAdapters(const ModelSpec& m, bool nf4_base,
                                 const std::vector<std::string>& targets,
                                 absl::string_view prefix);
absl::Status ValidateTrainingMethod(const TrainingMethod& t, const ModelSpec& m,
                                    absl::string_view prefix);
// A Plan request's host_memory_bytes: 0 (the hardware's) or [kMinHostMemoryGiB,
// kMaxHostMemoryGiB] GiB; the error names `field` and the range in bytes and in GiB.
absl::Status CheckHostMemoryOverride(absl::string_view field, int64_t bytes);
// A plan's (or fixed knob's) head_chunk_logit_bytes: 0 (kHeadChunkLogitBytes) or
// [kMinHeadChunkLogitBytes, kMaxHeadChunkLogitBytes] (common/head_chunking.h); the error names
// `field` and the range.
absl::Status CheckHeadChunkLogitBytes(absl::string_view field, int64_t bytes);

}  // namespace memplan
