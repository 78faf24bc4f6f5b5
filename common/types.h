// Domain types shared by the planner and the agent: plain structs, no protobuf, no Torch.
// They mirror proto/memplan/v1/planner.proto; common/proto_convert.h converts between them.
// Units are in the field names. Thread-compatible value types.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memplan {

enum class DType { kFloat32, kBFloat16, kFloat16 };
enum class BlockMode { kNone, kCkpt, kSwap, kHsOffload };
enum class HostMemoryKind { kPinned, kPageable };
enum class OptimizerKind { kAdamW, kAdamWBf16States, kSgd, kAdamW8bit };
// kQlora: LoRA adapters on a frozen base whose projection weights are 4-bit NF4
// (common/nf4_bytes.h). kOsft: orthogonal subspace fine-tuning, each targeted projection split by
// SVD into frozen high and trainable low factors (common/osft_cost.h).
enum class TrainingKind { kFull, kLora, kQlora, kOsft };

int64_t DTypeBytes(DType dtype);
std::string_view DTypeName(DType dtype);           // "fp32", "bf16", "fp16"
std::optional<DType> ParseDType(std::string_view name);
std::string_view BlockModeName(BlockMode mode);    // "none", "ckpt", "swap", "hs_offload"
std::string_view HostMemoryKindName(HostMemoryKind kind);  // "pinned", "pageable"
std::string_view OptimizerName(OptimizerKind kind);  // "adamw", "adamw_bf16", "sgd", "adamw8bit"
std::string_view TrainingKindName(TrainingKind kind);  // "full", "lora", "qlora", "osft"
std::optional<OptimizerKind> ParseOptimizer(std::string_view name);
// "adamw, adamw_bf16, sgd, adamw8bit": the allow-list, for error messages.
std::string_view OptimizerAllowList();

// Rotary-embedding frequency scaling, as Hugging Face's `rope_parameters` (transformers 5.x) or
// `rope_scaling` (older configs) describe it. The agent computes exactly these types; a config
// asking for any other is refused when it is parsed (common/hf_config.h). Shapes, memory and
// FLOPs do not depend on it: the planner ignores it.
struct RopeScaling {
  std::string type = "default";  // default | linear | dynamic | yarn | llama3
  double factor = 1.0;           // linear, dynamic, llama3, yarn
  // llama3 and yarn: the pre-training context; dynamic uses max_position_embeddings instead.
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  double attention_factor = 0;    // yarn: scales cos/sin; 0 = derived from factor and mscale*
  double beta_fast = 32;          // yarn
  double beta_slow = 1;           // yarn
  double mscale = 0;              // yarn, 0 = unset
  double mscale_all_dim = 0;      // yarn, 0 = unset
  bool truncate = true;           // yarn
};

// The vision tower of a vision-language model (family qwen2_5_vl), as transformers'
// Qwen2_5_VLVisionConfig describes it: a patch embedding (a linear over flattened
// [in_channels, temporal_patch_size, patch_size, patch_size] patches), `depth` pre-norm blocks
// (RMSNorm, attention with 2-D rotary positions over windows of window_size pixels, or over the
// whole image for the blocks in fullatt_block_indexes; SwiGLU MLP with biases), and a merger of
// spatial_merge_size² patches into one token of the language model's width (out_hidden_size).
// depth 0: no vision tower.
struct VisionSpec {
  int64_t depth = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t window_size = 112;  // pixels
  int64_t out_hidden_size = 0;
  std::vector<int64_t> fullatt_block_indexes;  // ascending
  double rope_theta = 10000.0;                 // the 2-D rotary embedding's base

  int64_t HeadDim() const { return num_heads > 0 ? hidden_size / num_heads : 0; }
  // Elements of one flattened patch, as the processor emits pixel_values rows.
  int64_t PatchDim() const {
    return in_channels * temporal_patch_size * patch_size * patch_size;
  }
  // Patches a window spans along each side, in merged units (transformers'
  // vit_merger_window_size).
  int64_t WindowMergedPatches() const { return window_size / spatial_merge_size / patch_size; }
  bool IsFullAttentionBlock(int64_t block) const {
    return std::find(fullatt_block_indexes.begin(), fullatt_block_indexes.end(), block) !=
           fullatt_block_indexes.end();
  }
};

struct ModelSpec {
  std::string name;
  // llama, qwen2, qwen3, mistral, qwen3_moe, mixtral, qwen2_5_vl, qwen2_vl, gemma2, gemma3_text
  std::string family = "llama";
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // 0: hidden_size / num_heads
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;
  bool qk_norm = false;
  double rope_theta = 500000.0;
  double rms_norm_eps = 1e-5;
  int64_t max_position_embeddings = 131072;
  RopeScaling rope_scaling;
  // Sliding-window attention of the checkpoint's config: the window W of its sliding layers (a
  // query at position i sees the keys j with i - W < j <= i), 0 when every layer attends to the
  // full causal context. sliding_layers lists the layers that slide (ascending, non-empty exactly
  // when W > 0): every layer for Mistral, those of "layer_types" / "max_window_layers" for Qwen.
  int64_t sliding_window = 0;
  std::vector<int64_t> sliding_layers;

  // Mixture of experts (families qwen3_moe and mixtral; 0 experts: every MLP is dense). A sparse
  // layer replaces the MLP by a router (linear hidden -> num_experts, softmax in fp32, top
  // num_experts_per_tok) and num_experts SwiGLU experts of moe_intermediate_size; dense layers
  // keep intermediate_size. Mixtral: every layer is sparse and the top-k weights are always
  // renormalised; Qwen3-MoE: layer i is sparse unless listed in mlp_only_layers or
  // (i + 1) % decoder_sparse_step != 0, and renormalises only with norm_topk_prob.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // The load-balancing loss (Switch Transformer's, over every sparse layer's router) is added to
  // the LM loss times router_aux_loss_coef only when output_router_logits is set, as Hugging
  // Face's *ForCausalLM does in training.
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;

  // Gemma 2 (family gemma2): the embedding is scaled by sqrt(hidden_size) (rounded to the model
  // dtype), every RMSNorm multiplies by (1 + weight) in fp32, a block has four norms (around the
  // attention and around the MLP, each output normed before the residual add) and a GeGLU MLP
  // (gelu, tanh approximation). Attention scores are scaled by query_pre_attn_scalar^-1/2 and,
  // when attn_logit_softcapping > 0, capped as tanh(s / cap) * cap before the mask; the logits
  // likewise with final_logit_softcapping. 0 disables a cap. embedding_padding_idx is
  // config.json's pad_token_id, the row nn.Embedding(padding_idx) gives no gradient from the
  // lookup (-1: none).
  double query_pre_attn_scalar = 0;
  double attn_logit_softcapping = 0;
  double final_logit_softcapping = 0;
  int64_t embedding_padding_idx = -1;
  // Gemma 3 (family gemma3_text) is Gemma 2's block with qk_norm as Gemma's (1 + weight) norm on
  // every head's query and key before RoPE, and two RoPEs: the sliding layers rotate with the
  // default frequencies of base rope_local_base_freq, the full layers with rope_theta and
  // rope_scaling. 0: every layer uses rope_theta and rope_scaling.
  double rope_local_base_freq = 0;

  // Vision-language (family qwen2_5_vl): the vision tower, the token ids the processor puts in
  // the text (one image_token_id per merged patch, between vision_start and vision_end), and the
  // language model's multimodal rotary embedding: mrope_section splits the head_dim / 2 rotary
  // frequencies into the parts rotated by the temporal, height and width positions (M-RoPE).
  VisionSpec vision;
  int64_t image_token_id = 0;
  int64_t video_token_id = 0;
  int64_t vision_start_token_id = 0;
  int64_t vision_end_token_id = 0;
  std::vector<int64_t> mrope_section;

  int64_t HeadDim() const { return head_dim > 0 ? head_dim : hidden_size / num_heads; }
  bool IsVisionLanguage() const { return vision.depth > 0; }
  // Gemma 2 and Gemma 3 share the block, norms, embedding and caps.
  bool IsGemma() const { return family == "gemma2" || family == "gemma3_text"; }
  // The factor attention scores are multiplied by before softmax (and before a soft cap).
  double AttentionScale() const {
    // pow(x, -0.5), as Python's x ** -0.5 computes transformers' scaling.
    return std::pow(query_pre_attn_scalar > 0 ? query_pre_attn_scalar
                                              : static_cast<double>(HeadDim()),
                    -0.5);
  }
  // The window layer `layer` attends within, 0 for full causal attention.
  int64_t LayerWindow(int64_t layer) const {
    for (int64_t l : sliding_layers) {
      if (l == layer) return sliding_window;
    }
    return 0;
  }
  bool IsMoe() const { return num_experts > 0; }
  bool IsMoeLayer(int64_t layer) const {
    if (num_experts <= 0) return false;
    for (int64_t l : mlp_only_layers) {
      if (l == layer) return false;
    }
    return decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
  }
  // Whether the loss carries the router load-balancing term.
  bool HasRouterAuxLoss() const {
    return num_experts > 0 && output_router_logits && router_aux_loss_coef != 0;
  }
};

struct HardwareSpec {
  std::string name;
  int64_t gpu_memory_bytes = 0;
  int64_t cuda_context_bytes = 0;
  double h2d_pinned_bytes_per_second = 0;
  double d2h_pinned_bytes_per_second = 0;
  double h2d_pageable_bytes_per_second = 0;
  double d2h_pageable_bytes_per_second = 0;
  double bidirectional_pinned_bytes_per_second = 0;
  double hbm_bytes_per_second = 0;
  double matmul_bf16_flops = 0;
  double matmul_fp16_flops = 0;
  double matmul_fp32_flops = 0;
  double nccl_allgather_bytes_per_second = 0;
  double nccl_reduce_scatter_bytes_per_second = 0;
  // [Collectives under compute]: the same, beside a GEMM load; 0 = not measured.
  double nccl_allgather_under_compute_bytes_per_second = 0;
  double nccl_reduce_scatter_under_compute_bytes_per_second = 0;
  double cpu_adam_params_per_second = 0;
  int64_t host_memory_bytes = 0;
  int64_t pinned_limit_bytes = 0;  // 0 = unlimited
  bool measured = false;
  // NF4 dequantization rate (bytes read + written per second, agent/quant); 0 = not measured.
  double nf4_dequant_bytes_per_second = 0;
  // The offloaded-chunk update with adamw8bit; 0 = not measured (kAdamW8bitCpuTimeFactor).
  double cpu_adamw8bit_params_per_second = 0;
  // [Two CPU passes] (common/optimizer_bytes.h): the offloaded-chunk work split the way the chunk
  // manager runs it under clipping: one micro-batch's bf16 grads added into the fp32 grad array
  // (beside backward), and the AdamW update over the fp32 master and moments from those grads,
  // writing the bf16 params (after backward). 0 = not measured: the model then charges the single
  // pass of cpu_adam_params_per_second.
  double cpu_grad_accumulate_params_per_second = 0;
  double cpu_adam_update_params_per_second = 0;
  // [CPU pass bytes]: the update pass of adamw_bf16 and of sgd as the chunk manager runs them;
  // 0 = not measured (cpu_adam_update_params_per_second scaled by the bytes each touches).
  double cpu_adamw_bf16_params_per_second = 0;
  double cpu_sgd_params_per_second = 0;
};

struct Workload {
  int64_t micro_batch = 1;
  int64_t seq_len = 1;
  int32_t world_size = 1;
  int32_t grad_accum = 1;
  bool grad_clipping = false;  // CPU optimizer waits for the global norm (no overlap)
  // Ranks per node, sharing its host memory (HardwareSpec::host_memory_bytes); 0 = world_size
  // (one node). LocalRanks() resolves it.
  int32_t local_world_size = 0;
  // A vision-language model's images per sample and their size in pixels (0: text only).
  int32_t images_per_sample = 0;
  int64_t image_height = 0;
  int64_t image_width = 0;
  // A trained vision tower recomputes its blocks in backward ([Vision tower bytes],
  // common/vision_cost.h); ignored without a tower. Set by the caller, or by the planner when the
  // plan does not fit otherwise (ResidencyPlan::vision_checkpoint).
  bool vision_checkpoint = false;
};

inline int32_t LocalRanks(const Workload& w) {
  return w.local_world_size > 0 ? w.local_world_size : std::max<int32_t>(1, w.world_size);
}

struct TrainingMethod {
  TrainingKind kind = TrainingKind::kFull;
  int64_t lora_rank = 0;
  std::vector<std::string> lora_target_modules;
  // kOsft: the fraction of each targeted weight's spectrum that trains, in (0, 1), and the
  // projections split (kLoraModules names, none repeated).
  double osft_rank_ratio = 0;
  std::vector<std::string> osft_target_modules;
};

// Per transformer block, measured by the profiler or synthesised analytically.
struct BlockTrace {
  int64_t param_bytes = 0;
  int64_t input_bytes = 0;
  int64_t saved_bytes = 0;
  int64_t forward_transient_bytes = 0;
  int64_t backward_transient_bytes = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double recompute_seconds = 0;
};

// Embedding (before the blocks) or final norm + LM head + loss (after them).
struct EdgeTrace {
  int64_t param_bytes = 0;
  int64_t saved_bytes = 0;
  int64_t forward_transient_bytes = 0;
  int64_t backward_transient_bytes = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
};

struct Trace {
  std::string trace_id;
  ModelSpec arch;
  Workload workload;
  DType param_dtype = DType::kBFloat16;
  TrainingMethod training;
  std::string hardware_name;
  bool analytic = true;
  EdgeTrace embedding;
  std::vector<BlockTrace> blocks;
  EdgeTrace head;
  int64_t trainable_param_count = 0;
  int64_t total_param_count = 0;
  int64_t forward_end_bytes = 0;
  int64_t chunk_bytes = 0;
  std::vector<int64_t> chunk_param_bytes;
};

// Caller-fixed knobs: a set field is a constraint on the search.
struct FixedKnobs {
  std::optional<int64_t> chunk_bytes;
  std::optional<int32_t> n_persist;
  std::optional<int32_t> n_buffer;
  std::optional<int32_t> n_swap;
  std::optional<int32_t> n_checkpoint;
  std::optional<int32_t> n_hs_offload;
  std::optional<HostMemoryKind> host_memory;
  std::optional<bool> shard_persistent_state;
  std::optional<bool> shard_persistent_params;
  std::optional<int64_t> head_chunk_logit_bytes;
};

struct ResidencyPlan {
  int64_t chunk_bytes = 0;
  int32_t n_chunks = 0;
  int32_t n_persist = 0;
  int32_t n_buffer = 0;
  int32_t n_swap = 0;
  int32_t n_checkpoint = 0;
  int32_t n_hs_offload = 0;
  HostMemoryKind host_memory = HostMemoryKind::kPinned;
  std::vector<BlockMode> block_modes;
  int32_t world_size = 1;
  // [Layout fingerprint] (common/chunk_packing.h) of the chunk layout n_chunks and n_persist refer
  // to; empty when unknown (older planners, hand-written plans, traces without a parameter list).
  std::string layout_fingerprint;
  // world_size > 1: persistent chunks' optimizer state sharded over the ranks, their parameters
  // replicated ([Sharded persistent state] in agent/chunks/chunk_manager.cc); false: replicated.
  bool shard_persistent_state = false;
  // With shard_persistent_state: the persistent chunks' parameters sharded too, all-gathered on
  // use ([Sharded persistent parameters], ZeRO-3 over them); false: replicated.
  bool shard_persistent_params = false;
  // The vision tower's blocks checkpointed (LlamaModelOptions::vision_checkpoint in the agent):
  // the workload's vision_checkpoint as given, or set by the planner when only that fits.
  bool vision_checkpoint = false;
  // fp32 logit bytes per chunk of the chunked LM head ([Chunked head], common/head_chunking.h);
  // 0 (older planners and plans): kHeadChunkLogitBytes.
  int64_t head_chunk_logit_bytes = 0;
};

struct MemoryBreakdown {
  int64_t persistent_chunks_bytes = 0;
  int64_t buffers_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t activations_bytes = 0;
  int64_t checkpoint_chain_bytes = 0;
  int64_t transient_bytes = 0;
  int64_t cuda_context_bytes = 0;
  double fragmentation_factor = 1.0;
  int64_t calibration_residual_bytes = 0;
  int64_t head_bytes = 0;  // of activations + transient: the LM head + loss at the peak
  int64_t exact_bytes = 0;  // of the model terms: exactly sized, not scaled by the factor
  // [Vocabulary-sized allocations] reserved bytes the caching allocator adds for the step's two
  // vocabulary-sized grads; a model term, counted in exact_bytes (not scaled by the factor).
  int64_t allocator_slack_bytes = 0;
};

// What one rank's chunk manager allocates for the plan, byte for byte (its ChunkMemoryStats,
// agent/chunks/chunk_manager.h): with world_size W each offloaded chunk is sharded
// (common/optimizer_bytes.h ShardElems), persistent chunks are replicated, device buffers are
// padded to a multiple of W. node_host_bytes = local_world_size x this rank's host bytes
// (offloaded activations included), what the node's RAM must hold.
struct RankMemory {
  int32_t world_size = 1;
  int32_t local_world_size = 1;
  int64_t persistent_device_bytes = 0;
  int64_t persistent_state_device_bytes = 0;
  int64_t buffer_device_bytes = 0;
  // shard_persistent_params: gathered persistent chunks held at once (a group's and the next).
  int64_t persistent_gather_device_bytes = 0;
  int64_t chunk_host_pinned_bytes = 0;
  int64_t chunk_host_pageable_bytes = 0;
  int64_t node_host_bytes = 0;
};

struct Prediction {
  int64_t peak_bytes = 0;
  MemoryBreakdown breakdown;
  int64_t load_peak_bytes = 0;
  int64_t host_pinned_bytes = 0;
  int64_t host_pageable_bytes = 0;
  double iteration_seconds = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double optimizer_seconds = 0;
  double tokens_per_second = 0;
  double time_factor = 1.0;  // step-time calibration included in the times above
  RankMemory rank_memory;
};

struct Measurement {
  std::string plan_id;
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t peak_device_bytes = 0;
  int64_t load_peak_bytes = 0;
  double step_seconds = 0;
  bool oom = false;
  std::string note;
  int64_t measured_at_unix_ms = 0;
};

struct Calibration {
  std::string hardware_name;
  DType param_dtype = DType::kBFloat16;
  std::string model_family;
  std::string method;     // "full", "lora", "qlora", "osft"; empty: learned before keys named it
  std::string optimizer;  // "adamw", ...; "*": the method's optimizers pooled; empty: as above
  double fragmentation_factor = 1.0;
  int64_t residual_bytes = 0;
  int32_t samples = 0;
  double mean_abs_relative_error = 0;
  int64_t updated_at_unix_ms = 0;
  double time_factor = 0;  // measured / predicted step time; 0 = no sample yet
  int32_t time_samples = 0;
};

}  // namespace memplan
