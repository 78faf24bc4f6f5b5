#include "common/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace memplan {
namespace {

// Every enum error has the same shape so callers and tests can rely on the field name and the
// list of accepted values being present.
absl::Status BadEnum(absl::string_view field, int value, absl::string_view allowed) {
  if (value == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is unspecified; allowed: ", allowed));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " = ", value, " is not a known value; allowed: ", allowed));
}

constexpr absl::string_view kDTypeValues = "DTYPE_FP32, DTYPE_BF16, DTYPE_FP16";
constexpr absl::string_view kBlockModeValues =
    "BLOCK_MODE_NONE, BLOCK_MODE_CKPT, BLOCK_MODE_SWAP, BLOCK_MODE_HS_OFFLOAD";
constexpr absl::string_view kHostMemoryValues = "HOST_MEMORY_PINNED, HOST_MEMORY_PAGEABLE";
constexpr absl::string_view kTrainingKindValues = "FULL, LORA, QLORA, OSFT";

}  // namespace

// ---------------------------------------------------------------- enums

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FP32;
    case DType::kBFloat16:
      return v1::DTYPE_BF16;
    case DType::kFloat16:
      return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::BlockMode ToProto(BlockMode mode) {
  switch (mode) {
    case BlockMode::kNone:
      return v1::BLOCK_MODE_NONE;
    case BlockMode::kCkpt:
      return v1::BLOCK_MODE_CKPT;
    case BlockMode::kSwap:
      return v1::BLOCK_MODE_SWAP;
    case BlockMode::kHsOffload:
      return v1::BLOCK_MODE_HS_OFFLOAD;
  }
  return v1::BLOCK_MODE_UNSPECIFIED;
}

v1::HostMemoryKind ToProto(HostMemoryKind kind) {
  switch (kind) {
    case HostMemoryKind::kPinned:
      return v1::HOST_MEMORY_PINNED;
    case HostMemoryKind::kPageable:
      return v1::HOST_MEMORY_PAGEABLE;
  }
  return v1::HOST_MEMORY_UNSPECIFIED;
}

v1::TrainingMethod::Kind ToProto(TrainingKind kind) {
  switch (kind) {
    case TrainingKind::kFull:
      return v1::TrainingMethod::FULL;
    case TrainingKind::kLora:
      return v1::TrainingMethod::LORA;
    case TrainingKind::kQlora:
      return v1::TrainingMethod::QLORA;
    case TrainingKind::kOsft:
      return v1::TrainingMethod::OSFT;
  }
  return v1::TrainingMethod::KIND_UNSPECIFIED;
}

absl::StatusOr<DType> DTypeFromProto(int value, absl::string_view field,
                                     std::optional<DType> if_unspecified) {
  switch (value) {
    case v1::DTYPE_FP32:
      return DType::kFloat32;
    case v1::DTYPE_BF16:
      return DType::kBFloat16;
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    case v1::DTYPE_UNSPECIFIED:
      if (if_unspecified.has_value()) return *if_unspecified;
      break;
    default:
      break;
  }
  return BadEnum(field, value, kDTypeValues);
}

absl::StatusOr<BlockMode> BlockModeFromProto(int value, absl::string_view field) {
  switch (value) {
    case v1::BLOCK_MODE_NONE:
      return BlockMode::kNone;
    case v1::BLOCK_MODE_CKPT:
      return BlockMode::kCkpt;
    case v1::BLOCK_MODE_SWAP:
      return BlockMode::kSwap;
    case v1::BLOCK_MODE_HS_OFFLOAD:
      return BlockMode::kHsOffload;
    default:
      break;
  }
  return BadEnum(field, value, kBlockModeValues);
}

absl::StatusOr<HostMemoryKind> HostMemoryKindFromProto(
    int value, absl::string_view field, std::optional<HostMemoryKind> if_unspecified) {
  switch (value) {
    case v1::HOST_MEMORY_PINNED:
      return HostMemoryKind::kPinned;
    case v1::HOST_MEMORY_PAGEABLE:
      return HostMemoryKind::kPageable;
    case v1::HOST_MEMORY_UNSPECIFIED:
      if (if_unspecified.has_value()) return *if_unspecified;
      break;
    default:
      break;
  }
  return BadEnum(field, value, kHostMemoryValues);
}

absl::StatusOr<TrainingKind> TrainingKindFromProto(int value, absl::string_view field) {
  switch (value) {
    case v1::TrainingMethod::KIND_UNSPECIFIED:
    case v1::TrainingMethod::FULL:
      return TrainingKind::kFull;
    case v1::TrainingMethod::LORA:
      return TrainingKind::kLora;
    case v1::TrainingMethod::QLORA:
      return TrainingKind::kQlora;
    case v1::TrainingMethod::OSFT:
      return TrainingKind::kOsft;
    default:
      break;
  }
  return BadEnum(field, value, kTrainingKindValues);
}

// ---------------------------------------------------------------- domain -> proto

v1::ModelArch ToProto(const ModelSpec& spec) {
  v1::ModelArch out;
  out.set_name(spec.name);
  out.set_family(spec.family);
  out.set_hidden_size(spec.hidden_size);
  out.set_num_layers(spec.num_layers);
  out.set_num_heads(spec.num_heads);
  out.set_num_kv_heads(spec.num_kv_heads);
  out.set_head_dim(spec.head_dim);
  out.set_intermediate_size(spec.intermediate_size);
  out.set_vocab_size(spec.vocab_size);
  out.set_tie_word_embeddings(spec.tie_word_embeddings);
  out.set_qkv_bias(spec.qkv_bias);
  out.set_qk_norm(spec.qk_norm);
  out.set_rope_theta(spec.rope_theta);
  out.set_rms_norm_eps(spec.rms_norm_eps);
  out.set_max_position_embeddings(spec.max_position_embeddings);
  out.set_num_experts(spec.num_experts);
  out.set_num_experts_per_tok(spec.num_experts_per_tok);
  out.set_moe_intermediate_size(spec.moe_intermediate_size);
  out.set_norm_topk_prob(spec.norm_topk_prob);
  // Unset (0) reads back as 1, the default.
  if (spec.decoder_sparse_step != 1) out.set_decoder_sparse_step(spec.decoder_sparse_step);
  for (int64_t l : spec.mlp_only_layers) out.add_mlp_only_layers(l);
  out.set_output_router_logits(spec.output_router_logits);
  out.set_router_aux_loss_coef(spec.router_aux_loss_coef);
  out.set_sliding_window(spec.sliding_window);
  for (int64_t l : spec.sliding_layers) out.add_sliding_layers(l);
  if (spec.IsVisionLanguage()) {
    const VisionSpec& v = spec.vision;
    v1::VisionArch* vision = out.mutable_vision();
    vision->set_depth(v.depth);
    vision->set_hidden_size(v.hidden_size);
    vision->set_intermediate_size(v.intermediate_size);
    vision->set_num_heads(v.num_heads);
    vision->set_in_channels(v.in_channels);
    vision->set_patch_size(v.patch_size);
    vision->set_spatial_merge_size(v.spatial_merge_size);
    vision->set_temporal_patch_size(v.temporal_patch_size);
    vision->set_window_size(v.window_size);
    vision->set_out_hidden_size(v.out_hidden_size);
    for (int64_t b : v.fullatt_block_indexes) vision->add_fullatt_block_indexes(b);
    vision->set_rope_theta(v.rope_theta);
    out.set_image_token_id(spec.image_token_id);
    out.set_video_token_id(spec.video_token_id);
    out.set_vision_start_token_id(spec.vision_start_token_id);
    out.set_vision_end_token_id(spec.vision_end_token_id);
  }
  for (int64_t s : spec.mrope_section) out.add_mrope_section(s);
  out.set_query_pre_attn_scalar(spec.query_pre_attn_scalar);
  out.set_attn_logit_softcapping(spec.attn_logit_softcapping);
  out.set_final_logit_softcapping(spec.final_logit_softcapping);
  return out;
}

v1::HardwareProfile ToProto(const HardwareSpec& spec) {
  v1::HardwareProfile out;
  out.set_name(spec.name);
  out.set_gpu_memory_bytes(spec.gpu_memory_bytes);
  out.set_cuda_context_bytes(spec.cuda_context_bytes);
  out.set_h2d_pinned_bytes_per_second(spec.h2d_pinned_bytes_per_second);
  out.set_d2h_pinned_bytes_per_second(spec.d2h_pinned_bytes_per_second);
  out.set_h2d_pageable_bytes_per_second(spec.h2d_pageable_bytes_per_second);
  out.set_d2h_pageable_bytes_per_second(spec.d2h_pageable_bytes_per_second);
  out.set_bidirectional_pinned_bytes_per_second(spec.bidirectional_pinned_bytes_per_second);
  out.set_hbm_bytes_per_second(spec.hbm_bytes_per_second);
  out.set_matmul_bf16_flops(spec.matmul_bf16_flops);
  out.set_matmul_fp16_flops(spec.matmul_fp16_flops);
  out.set_matmul_fp32_flops(spec.matmul_fp32_flops);
  out.set_nccl_allgather_bytes_per_second(spec.nccl_allgather_bytes_per_second);
  out.set_nccl_reduce_scatter_bytes_per_second(spec.nccl_reduce_scatter_bytes_per_second);
  out.set_nccl_allgather_under_compute_bytes_per_second(
      spec.nccl_allgather_under_compute_bytes_per_second);
  out.set_nccl_reduce_scatter_under_compute_bytes_per_second(
      spec.nccl_reduce_scatter_under_compute_bytes_per_second);
  out.set_cpu_adam_params_per_second(spec.cpu_adam_params_per_second);
  out.set_host_memory_bytes(spec.host_memory_bytes);
  out.set_pinned_limit_bytes(spec.pinned_limit_bytes);
  out.set_measured(spec.measured);
  out.set_nf4_dequant_bytes_per_second(spec.nf4_dequant_bytes_per_second);
  out.set_cpu_adamw8bit_params_per_second(spec.cpu_adamw8bit_params_per_second);
  out.set_cpu_grad_accumulate_params_per_second(spec.cpu_grad_accumulate_params_per_second);
  out.set_cpu_adam_update_params_per_second(spec.cpu_adam_update_params_per_second);
  out.set_cpu_adamw_bf16_params_per_second(spec.cpu_adamw_bf16_params_per_second);
  out.set_cpu_sgd_params_per_second(spec.cpu_sgd_params_per_second);
  return out;
}

v1::Workload ToProto(const Workload& workload) {
  v1::Workload out;
  out.set_micro_batch(workload.micro_batch);
  out.set_seq_len(workload.seq_len);
  out.set_world_size(workload.world_size);
  out.set_grad_accum(workload.grad_accum);
  out.set_grad_clipping(workload.grad_clipping);
  out.set_local_world_size(workload.local_world_size);
  out.set_images_per_sample(workload.images_per_sample);
  out.set_image_height(workload.image_height);
  out.set_image_width(workload.image_width);
  out.set_vision_checkpoint(workload.vision_checkpoint);
  return out;
}

v1::TrainingMethod ToProto(const TrainingMethod& method) {
  v1::TrainingMethod out;
  out.set_kind(ToProto(method.kind));
  out.set_lora_rank(method.lora_rank);
  for (const std::string& module : method.lora_target_modules) {
    out.add_lora_target_modules(module);
  }
  out.set_osft_rank_ratio(method.osft_rank_ratio);
  for (const std::string& module : method.osft_target_modules) {
    out.add_osft_target_modules(module);
  }
  return out;
}

v1::BlockTrace ToProto(const BlockTrace& block) {
  v1::BlockTrace out;
  out.set_param_bytes(block.param_bytes);
  out.set_input_bytes(block.input_bytes);
  out.set_saved_bytes(block.saved_bytes);
  out.set_forward_transient_bytes(block.forward_transient_bytes);
  out.set_backward_transient_bytes(block.backward_transient_bytes);
  out.set_forward_seconds(block.forward_seconds);
  out.set_backward_seconds(block.backward_seconds);
  out.set_recompute_seconds(block.recompute_seconds);
  return out;
}

v1::EdgeTrace ToProto(const EdgeTrace& edge) {
  v1::EdgeTrace out;
  out.set_param_bytes(edge.param_bytes);
  out.set_saved_bytes(edge.saved_bytes);
  out.set_forward_transient_bytes(edge.forward_transient_bytes);
  out.set_backward_transient_bytes(edge.backward_transient_bytes);
  out.set_forward_seconds(edge.forward_seconds);
  out.set_backward_seconds(edge.backward_seconds);
  return out;
}

v1::Trace ToProto(const Trace& trace) {
  v1::Trace out;
  out.set_trace_id(trace.trace_id);
  *out.mutable_arch() = ToProto(trace.arch);
  *out.mutable_workload() = ToProto(trace.workload);
  out.set_param_dtype(ToProto(trace.param_dtype));
  *out.mutable_training() = ToProto(trace.training);
  out.set_hardware_name(trace.hardware_name);
  out.set_analytic(trace.analytic);
  *out.mutable_embedding() = ToProto(trace.embedding);
  out.mutable_blocks()->Reserve(static_cast<int>(trace.blocks.size()));
  for (const BlockTrace& block : trace.blocks) *out.add_blocks() = ToProto(block);
  *out.mutable_head() = ToProto(trace.head);
  out.set_trainable_param_count(trace.trainable_param_count);
  out.set_total_param_count(trace.total_param_count);
  out.set_forward_end_bytes(trace.forward_end_bytes);
  out.set_chunk_bytes(trace.chunk_bytes);
  for (int64_t bytes : trace.chunk_param_bytes) out.add_chunk_param_bytes(bytes);
  return out;
}

v1::FixedKnobs ToProto(const FixedKnobs& knobs) {
  v1::FixedKnobs out;
  if (knobs.chunk_bytes) out.set_chunk_bytes(*knobs.chunk_bytes);
  if (knobs.n_persist) out.set_n_persist(*knobs.n_persist);
  if (knobs.n_buffer) out.set_n_buffer(*knobs.n_buffer);
  if (knobs.n_swap) out.set_n_swap(*knobs.n_swap);
  if (knobs.n_checkpoint) out.set_n_checkpoint(*knobs.n_checkpoint);
  if (knobs.n_hs_offload) out.set_n_hs_offload(*knobs.n_hs_offload);
  if (knobs.host_memory) out.set_host_memory(ToProto(*knobs.host_memory));
  if (knobs.shard_persistent_state) out.set_shard_persistent_state(*knobs.shard_persistent_state);
  if (knobs.shard_persistent_params) {
    out.set_shard_persistent_params(*knobs.shard_persistent_params);
  }
  if (knobs.head_chunk_logit_bytes) out.set_head_chunk_logit_bytes(*knobs.head_chunk_logit_bytes);
  return out;
}

v1::ResidencyPlan ToProto(const ResidencyPlan& plan) {
  v1::ResidencyPlan out;
  out.set_chunk_bytes(plan.chunk_bytes);
  out.set_n_chunks(plan.n_chunks);
  out.set_n_persist(plan.n_persist);
  out.set_n_buffer(plan.n_buffer);
  out.set_n_swap(plan.n_swap);
  out.set_n_checkpoint(plan.n_checkpoint);
  out.set_n_hs_offload(plan.n_hs_offload);
  out.set_host_memory(ToProto(plan.host_memory));
  for (BlockMode mode : plan.block_modes) out.add_block_modes(ToProto(mode));
  out.set_world_size(plan.world_size);
  out.set_shard_persistent_state(plan.shard_persistent_state);
  out.set_shard_persistent_params(plan.shard_persistent_params);
  out.set_vision_checkpoint(plan.vision_checkpoint);
  out.set_layout_fingerprint(plan.layout_fingerprint);
  out.set_head_chunk_logit_bytes(plan.head_chunk_logit_bytes);
  return out;
}

v1::MemoryBreakdown ToProto(const MemoryBreakdown& breakdown) {
  v1::MemoryBreakdown out;
  out.set_persistent_chunks_bytes(breakdown.persistent_chunks_bytes);
  out.set_buffers_bytes(breakdown.buffers_bytes);
  out.set_grads_bytes(breakdown.grads_bytes);
  out.set_optimizer_state_bytes(breakdown.optimizer_state_bytes);
  out.set_activations_bytes(breakdown.activations_bytes);
  out.set_checkpoint_chain_bytes(breakdown.checkpoint_chain_bytes);
  out.set_transient_bytes(breakdown.transient_bytes);
  out.set_cuda_context_bytes(breakdown.cuda_context_bytes);
  out.set_fragmentation_factor(breakdown.fragmentation_factor);
  out.set_calibration_residual_bytes(breakdown.calibration_residual_bytes);
  out.set_head_bytes(breakdown.head_bytes);
  out.set_allocator_slack_bytes(breakdown.allocator_slack_bytes);
  out.set_exact_bytes(breakdown.exact_bytes);
  return out;
}

v1::Prediction ToProto(const Prediction& prediction) {
  v1::Prediction out;
  out.set_peak_bytes(prediction.peak_bytes);
  *out.mutable_breakdown() = ToProto(prediction.breakdown);
  out.set_load_peak_bytes(prediction.load_peak_bytes);
  out.set_host_pinned_bytes(prediction.host_pinned_bytes);
  out.set_host_pageable_bytes(prediction.host_pageable_bytes);
  out.set_iteration_seconds(prediction.iteration_seconds);
  out.set_forward_seconds(prediction.forward_seconds);
  out.set_backward_seconds(prediction.backward_seconds);
  out.set_optimizer_seconds(prediction.optimizer_seconds);
  out.set_tokens_per_second(prediction.tokens_per_second);
  out.set_time_factor(prediction.time_factor);
  const RankMemory& r = prediction.rank_memory;
  v1::RankMemory* rm = out.mutable_rank_memory();
  rm->set_world_size(r.world_size);
  rm->set_local_world_size(r.local_world_size);
  rm->set_persistent_device_bytes(r.persistent_device_bytes);
  rm->set_persistent_state_device_bytes(r.persistent_state_device_bytes);
  rm->set_buffer_device_bytes(r.buffer_device_bytes);
  rm->set_persistent_gather_device_bytes(r.persistent_gather_device_bytes);
  rm->set_chunk_host_pinned_bytes(r.chunk_host_pinned_bytes);
  rm->set_chunk_host_pageable_bytes(r.chunk_host_pageable_bytes);
  rm->set_node_host_bytes(r.node_host_bytes);
  return out;
}

v1::Measurement ToProto(const Measurement& measurement) {
  v1::Measurement out;
  out.set_plan_id(measurement.plan_id);
  out.set_peak_allocated_bytes(measurement.peak_allocated_bytes);
  out.set_peak_reserved_bytes(measurement.peak_reserved_bytes);
  out.set_peak_device_bytes(measurement.peak_device_bytes);
  out.set_load_peak_bytes(measurement.load_peak_bytes);
  out.set_step_seconds(measurement.step_seconds);
  out.set_oom(measurement.oom);
  out.set_note(measurement.note);
  out.set_measured_at_unix_ms(measurement.measured_at_unix_ms);
  return out;
}

v1::Calibration ToProto(const Calibration& calibration) {
  v1::Calibration out;
  out.set_hardware_name(calibration.hardware_name);
  out.set_param_dtype(ToProto(calibration.param_dtype));
  out.set_model_family(calibration.model_family);
  out.set_method(calibration.method);
  out.set_optimizer(calibration.optimizer);
  out.set_fragmentation_factor(calibration.fragmentation_factor);
  out.set_residual_bytes(calibration.residual_bytes);
  out.set_samples(calibration.samples);
  out.set_mean_abs_relative_error(calibration.mean_abs_relative_error);
  out.set_updated_at_unix_ms(calibration.updated_at_unix_ms);
  out.set_time_factor(calibration.time_factor);
  out.set_time_samples(calibration.time_samples);
  return out;
}

// ---------------------------------------------------------------- proto -> domain

ModelSpec ModelSpecFromProto(const v1::ModelArch& arch) {
  ModelSpec out;  // proto3 cannot tell "0" from "unset"; zeros keep the domain defaults.
  out.name = arch.name();
  if (!arch.family().empty()) out.family = arch.family();
  out.hidden_size = arch.hidden_size();
  out.num_layers = arch.num_layers();
  out.num_heads = arch.num_heads();
  out.num_kv_heads = arch.num_kv_heads();
  out.head_dim = arch.head_dim();
  out.intermediate_size = arch.intermediate_size();
  out.vocab_size = arch.vocab_size();
  out.tie_word_embeddings = arch.tie_word_embeddings();
  out.qkv_bias = arch.qkv_bias();
  out.qk_norm = arch.qk_norm();
  if (arch.rope_theta() != 0) out.rope_theta = arch.rope_theta();
  if (arch.rms_norm_eps() != 0) out.rms_norm_eps = arch.rms_norm_eps();
  if (arch.max_position_embeddings() != 0) {
    out.max_position_embeddings = arch.max_position_embeddings();
  }
  out.num_experts = arch.num_experts();
  out.num_experts_per_tok = arch.num_experts_per_tok();
  out.moe_intermediate_size = arch.moe_intermediate_size();
  out.norm_topk_prob = arch.norm_topk_prob();
  if (arch.decoder_sparse_step() != 0) out.decoder_sparse_step = arch.decoder_sparse_step();
  out.mlp_only_layers.assign(arch.mlp_only_layers().begin(), arch.mlp_only_layers().end());
  out.output_router_logits = arch.output_router_logits();
  out.router_aux_loss_coef = arch.router_aux_loss_coef();
  out.sliding_window = arch.sliding_window();
  out.sliding_layers.assign(arch.sliding_layers().begin(), arch.sliding_layers().end());
  if (arch.has_vision()) {
    const v1::VisionArch& v = arch.vision();
    VisionSpec& vision = out.vision;
    vision.depth = v.depth();
    vision.hidden_size = v.hidden_size();
    vision.intermediate_size = v.intermediate_size();
    vision.num_heads = v.num_heads();
    vision.in_channels = v.in_channels();
    vision.patch_size = v.patch_size();
    vision.spatial_merge_size = v.spatial_merge_size();
    vision.temporal_patch_size = v.temporal_patch_size();
    vision.window_size = v.window_size();
    vision.out_hidden_size = v.out_hidden_size();
    vision.fullatt_block_indexes.assign(v.fullatt_block_indexes().begin(),
                                        v.fullatt_block_indexes().end());
    if (v.rope_theta() != 0) vision.rope_theta = v.rope_theta();
  }
  out.image_token_id = arch.image_token_id();
  out.video_token_id = arch.video_token_id();
  out.vision_start_token_id = arch.vision_start_token_id();
  out.vision_end_token_id = arch.vision_end_token_id();
  out.mrope_section.assign(arch.mrope_section().begin(), arch.mrope_section().end());
  out.query_pre_attn_scalar = arch.query_pre_attn_scalar();
  out.attn_logit_softcapping = arch.attn_logit_softcapping();
  out.final_logit_softcapping = arch.final_logit_softcapping();
  return out;
}

HardwareSpec HardwareSpecFromProto(const v1::HardwareProfile& profile) {
  HardwareSpec out;
  out.name = profile.name();
  out.gpu_memory_bytes = profile.gpu_memory_bytes();
  out.cuda_context_bytes = profile.cuda_context_bytes();
  out.h2d_pinned_bytes_per_second = profile.h2d_pinned_bytes_per_second();
  out.d2h_pinned_bytes_per_second = profile.d2h_pinned_bytes_per_second();
  out.h2d_pageable_bytes_per_second = profile.h2d_pageable_bytes_per_second();
  out.d2h_pageable_bytes_per_second = profile.d2h_pageable_bytes_per_second();
  out.bidirectional_pinned_bytes_per_second = profile.bidirectional_pinned_bytes_per_second();
  out.hbm_bytes_per_second = profile.hbm_bytes_per_second();
  out.matmul_bf16_flops = profile.matmul_bf16_flops();
  out.matmul_fp16_flops = profile.matmul_fp16_flops();
  out.matmul_fp32_flops = profile.matmul_fp32_flops();
  out.nccl_allgather_bytes_per_second = profile.nccl_allgather_bytes_per_second();
  out.nccl_reduce_scatter_bytes_per_second = profile.nccl_reduce_scatter_bytes_per_second();
  out.nccl_allgather_under_compute_bytes_per_second =
      profile.nccl_allgather_under_compute_bytes_per_second();
  out.nccl_reduce_scatter_under_compute_bytes_per_second =
      profile.nccl_reduce_scatter_under_compute_bytes_per_second();
  out.cpu_adam_params_per_second = profile.cpu_adam_params_per_second();
  out.host_memory_bytes = profile.host_memory_bytes();
  out.pinned_limit_bytes = profile.pinned_limit_bytes();
  out.measured = profile.measured();
  out.nf4_dequant_bytes_per_second = profile.nf4_dequant_bytes_per_second();
  out.cpu_adamw8bit_params_per_second = profile.cpu_adamw8bit_params_per_second();
  out.cpu_grad_accumulate_params_per_second = profile.cpu_grad_accumulate_params_per_second();
  out.cpu_adam_update_params_per_second = profile.cpu_adam_update_params_per_second();
  out.cpu_adamw_bf16_params_per_second = profile.cpu_adamw_bf16_params_per_second();
  out.cpu_sgd_params_per_second = profile.cpu_sgd_params_per_second();
  return out;
}

Workload WorkloadFromProto(const v1::Workload& workload) {
  Workload out;
  out.micro_batch = workload.micro_batch();
  out.seq_len = workload.seq_len();
  // The proto documents 0 as "one": most callers train on a single GPU without accumulation
  // and should not have to say so. Negative values pass through for validation to reject.
  out.world_size = workload.world_size() == 0 ? 1 : workload.world_size();
  out.grad_accum = workload.grad_accum() == 0 ? 1 : workload.grad_accum();
  out.grad_clipping = workload.grad_clipping();
  out.local_world_size = workload.local_world_size();  // 0 = world_size: LocalRanks()
  out.images_per_sample = workload.images_per_sample();
  out.image_height = workload.image_height();
  out.image_width = workload.image_width();
  out.vision_checkpoint = workload.vision_checkpoint();
  return out;
}

absl::StatusOr<TrainingMethod> TrainingMethodFromProto(const v1::TrainingMethod& method,
                                                       absl::string_view prefix) {
  TrainingMethod out;
  ASSIGN_OR_RETURN(out.kind, TrainingKindFromProto(method.kind(), absl::StrCat(prefix, "kind")));
  out.lora_rank = method.lora_rank();
  out.lora_target_modules.assign(method.lora_target_modules().begin(),
                                 method.lora_target_modules().end());
  out.osft_rank_ratio = method.osft_rank_ratio();
  out.osft_target_modules.assign(method.osft_target_modules().begin(),
                                 method.osft_target_modules().end());
  return out;
}

BlockTrace BlockTraceFromProto(const v1::BlockTrace& block) {
  BlockTrace out;
  out.param_bytes = block.param_bytes();
  out.input_bytes = block.input_bytes();
  out.saved_bytes = block.saved_bytes();
  out.forward_transient_bytes = block.forward_transient_bytes();
  out.backward_transient_bytes = block.backward_transient_bytes();
  out.forward_seconds = block.forward_seconds();
  out.backward_seconds = block.backward_seconds();
  out.recompute_seconds = block.recompute_seconds();
  return out;
}

EdgeTrace EdgeTraceFromProto(const v1::EdgeTrace& edge) {
  EdgeTrace out;
  out.param_bytes = edge.param_bytes();
  out.saved_bytes = edge.saved_bytes();
  out.forward_transient_bytes = edge.forward_transient_bytes();
  out.backward_transient_bytes = edge.backward_transient_bytes();
  out.forward_seconds = edge.forward_seconds();
  out.backward_seconds = edge.backward_seconds();
  return out;
}

absl::StatusOr<Trace> TraceFromProto(const v1::Trace& trace, absl::string_view prefix) {
  Trace out;
  out.trace_id = trace.trace_id();
  out.arch = ModelSpecFromProto(trace.arch());
  out.workload = WorkloadFromProto(trace.workload());
  ASSIGN_OR_RETURN(out.param_dtype,
                   DTypeFromProto(trace.param_dtype(), absl::StrCat(prefix, "param_dtype")));
  ASSIGN_OR_RETURN(out.training,
                   TrainingMethodFromProto(trace.training(), absl::StrCat(prefix, "training.")));
  out.hardware_name = trace.hardware_name();
  out.analytic = trace.analytic();
  out.embedding = EdgeTraceFromProto(trace.embedding());
  out.blocks.reserve(trace.blocks_size());
  for (const v1::BlockTrace& block : trace.blocks())
    out.blocks.push_back(BlockTraceFromProto(block));
  out.head = EdgeTraceFromProto(trace.head());
  out.trainable_param_count = trace.trainable_param_count();
  out.total_param_count = trace.total_param_count();
  out.forward_end_bytes = trace.forward_end_bytes();
  out.chunk_bytes = trace.chunk_bytes();
  out.chunk_param_bytes.assign(trace.chunk_param_bytes().begin(), trace.chunk_param_bytes().end());
  return out;
}

absl::StatusOr<FixedKnobs> FixedKnobsFromProto(const v1::FixedKnobs& knobs,
                                               absl::string_view prefix) {
  FixedKnobs out;
  if (knobs.has_chunk_bytes()) out.chunk_bytes = knobs.chunk_bytes();
  if (knobs.has_n_persist()) out.n_persist = knobs.n_persist();
  if (knobs.has_n_buffer()) out.n_buffer = knobs.n_buffer();
  if (knobs.has_n_swap()) out.n_swap = knobs.n_swap();
  if (knobs.has_n_checkpoint()) out.n_checkpoint = knobs.n_checkpoint();
  if (knobs.has_n_hs_offload()) out.n_hs_offload = knobs.n_hs_offload();
  if (knobs.has_host_memory()) {
    // Present-but-unspecified is a caller mistake, not "search it": the knob was set.
    ASSIGN_OR_RETURN(out.host_memory, HostMemoryKindFromProto(knobs.host_memory(),
                                                              absl::StrCat(prefix, "host_memory")));
  }
  if (knobs.has_shard_persistent_state()) {
    out.shard_persistent_state = knobs.shard_persistent_state();
  }
  if (knobs.has_shard_persistent_params()) {
    out.shard_persistent_params = knobs.shard_persistent_params();
  }
  if (knobs.has_head_chunk_logit_bytes()) {
    out.head_chunk_logit_bytes = knobs.head_chunk_logit_bytes();
  }
  return out;
}

absl::StatusOr<ResidencyPlan> ResidencyPlanFromProto(const v1::ResidencyPlan& plan,
                                                     absl::string_view prefix) {
  ResidencyPlan out;
  out.chunk_bytes = plan.chunk_bytes();
  out.n_chunks = plan.n_chunks();
  out.n_persist = plan.n_persist();
  out.n_buffer = plan.n_buffer();
  out.n_swap = plan.n_swap();
  out.n_checkpoint = plan.n_checkpoint();
  out.n_hs_offload = plan.n_hs_offload();
  ASSIGN_OR_RETURN(out.host_memory, HostMemoryKindFromProto(plan.host_memory(),
                                                            absl::StrCat(prefix, "host_memory")));
  out.block_modes.reserve(plan.block_modes_size());
  for (int i = 0; i < plan.block_modes_size(); ++i) {
    ASSIGN_OR_RETURN(
        BlockMode mode,
        BlockModeFromProto(plan.block_modes(i), absl::StrCat(prefix, "block_modes[", i, "]")));
    out.block_modes.push_back(mode);
  }
  out.world_size = plan.world_size() == 0 ? 1 : plan.world_size();
  out.shard_persistent_state = plan.shard_persistent_state();
  out.shard_persistent_params = plan.shard_persistent_params();
  out.vision_checkpoint = plan.vision_checkpoint();
  out.layout_fingerprint = plan.layout_fingerprint();
  out.head_chunk_logit_bytes = plan.head_chunk_logit_bytes();
  return out;
}

MemoryBreakdown MemoryBreakdownFromProto(const v1::MemoryBreakdown& breakdown) {
  MemoryBreakdown out;
  out.persistent_chunks_bytes = breakdown.persistent_chunks_bytes();
  out.buffers_bytes = breakdown.buffers_bytes();
  out.grads_bytes = breakdown.grads_bytes();
  out.optimizer_state_bytes = breakdown.optimizer_state_bytes();
  out.activations_bytes = breakdown.activations_bytes();
  out.checkpoint_chain_bytes = breakdown.checkpoint_chain_bytes();
  out.transient_bytes = breakdown.transient_bytes();
  out.cuda_context_bytes = breakdown.cuda_context_bytes();
  if (breakdown.fragmentation_factor() != 0) {
    out.fragmentation_factor = breakdown.fragmentation_factor();
  }
  out.calibration_residual_bytes = breakdown.calibration_residual_bytes();
  out.head_bytes = breakdown.head_bytes();
  out.allocator_slack_bytes = breakdown.allocator_slack_bytes();
  out.exact_bytes = breakdown.exact_bytes();
  return out;
}

Prediction PredictionFromProto(const v1::Prediction& prediction) {
  Prediction out;
  out.peak_bytes = prediction.peak_bytes();
  out.breakdown = MemoryBreakdownFromProto(prediction.breakdown());
  out.load_peak_bytes = prediction.load_peak_bytes();
  out.host_pinned_bytes = prediction.host_pinned_bytes();
  out.host_pageable_bytes = prediction.host_pageable_bytes();
  out.iteration_seconds = prediction.iteration_seconds();
  out.forward_seconds = prediction.forward_seconds();
  out.backward_seconds = prediction.backward_seconds();
  out.optimizer_seconds = prediction.optimizer_seconds();
  out.tokens_per_second = prediction.tokens_per_second();
  out.time_factor = prediction.time_factor() > 0 ? prediction.time_factor() : 1.0;
  const v1::RankMemory& rm = prediction.rank_memory();
  RankMemory& r = out.rank_memory;
  r.world_size = rm.world_size() == 0 ? 1 : rm.world_size();
  r.local_world_size = rm.local_world_size() == 0 ? 1 : rm.local_world_size();
  r.persistent_device_bytes = rm.persistent_device_bytes();
  r.persistent_state_device_bytes = rm.persistent_state_device_bytes();
  r.buffer_device_bytes = rm.buffer_device_bytes();
  r.persistent_gather_device_bytes = rm.persistent_gather_device_bytes();
  r.chunk_host_pinned_bytes = rm.chunk_host_pinned_bytes();
  r.chunk_host_pageable_bytes = rm.chunk_host_pageable_bytes();
  r.node_host_bytes = rm.node_host_bytes();
  return out;
}

Measurement MeasurementFromProto(const v1::Measurement& measurement) {
  Measurement out;
  out.plan_id = measurement.plan_id();
  out.peak_allocated_bytes = measurement.peak_allocated_bytes();
  out.peak_reserved_bytes = measurement.peak_reserved_bytes();
  out.peak_device_bytes = measurement.peak_device_bytes();
  out.load_peak_bytes = measurement.load_peak_bytes();
  out.step_seconds = measurement.step_seconds();
  out.oom = measurement.oom();
  out.note = measurement.note();
  out.measured_at_unix_ms = measurement.measured_at_unix_ms();
  return out;
}

absl::StatusOr<Calibration> CalibrationFromProto(const v1::Calibration& calibration,
                                                 absl::string_view prefix) {
  Calibration out;
  out.hardware_name = calibration.hardware_name();
  ASSIGN_OR_RETURN(out.param_dtype,
                   DTypeFromProto(calibration.param_dtype(), absl::StrCat(prefix, "param_dtype")));
  out.model_family = calibration.model_family();
  out.method = calibration.method();
  out.optimizer = calibration.optimizer();
  out.fragmentation_factor = calibration.fragmentation_factor();
  out.residual_bytes = calibration.residual_bytes();
  out.samples = calibration.samples();
  out.mean_abs_relative_error = calibration.mean_abs_relative_error();
  out.updated_at_unix_ms = calibration.updated_at_unix_ms();
  out.time_factor = calibration.time_factor();
  out.time_samples = calibration.time_samples();
  return out;
}

}  // namespace memplan
