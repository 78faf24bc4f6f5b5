#include "common/validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/head_chunking.h"
#include "common/lora_shapes.h"
#include "common/osft_cost.h"
#include "common/vision_kind.h"

namespace memplan {
namespace {

absl::Status OutOfRange(absl::string_view prefix, absl::string_view field, double value, double lo,
                        double hi) {
  return absl::InvalidArgumentError(absl::StrCat(prefix, field, " = ", value,
                                                 " is out of range; allowed [", lo, ", ", hi,
                                                 "]"));
}

absl::Status CheckInt(absl::string_view prefix, absl::string_view field, int64_t value, int64_t lo,
                      int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, field, " = ", value,
                                                   " is out of range; allowed [", lo, ", ", hi,
                                                   "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckRate(absl::string_view prefix, absl::string_view field, double value,
                       bool required) {
  if (!std::isfinite(value) || value < 0 || value > kMaxRate || (required && value == 0)) {
    return OutOfRange(prefix, field, value, required ? 1 : 0, kMaxRate);
  }
  return absl::OkStatus();
}

absl::Status CheckBytes(absl::string_view field, absl::string_view value, size_t max_bytes) {
  if (value.size() <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " is ", value.size(), " bytes; allowed at most ", max_bytes, " (", Quote(value), ")"));
}

// The vision tower and the multimodal token ids and rotary sections of a qwen2_5_vl or qwen2_vl
// spec.
absl::Status ValidateVisionLanguage(const ModelSpec& m, absl::string_view prefix) {
  const VisionSpec& v = m.vision;
  const std::string vp = absl::StrCat(prefix, "vision.");
  struct Field {
    const char* name;
    int64_t value;
    int64_t hi;
  };
  const Field fields[] = {
      {"depth", v.depth, kMaxLayers},
      {"hidden_size", v.hidden_size, kMaxHiddenSize},
      {"intermediate_size", v.intermediate_size, kMaxIntermediateSize},
      {"num_heads", v.num_heads, kMaxHeads},
      {"in_channels", v.in_channels, 16},
      {"patch_size", v.patch_size, 1024},
      {"spatial_merge_size", v.spatial_merge_size, 64},
      {"temporal_patch_size", v.temporal_patch_size, 64},
      {"window_size", v.window_size, int64_t{1} << 20},
      {"out_hidden_size", v.out_hidden_size, kMaxHiddenSize},
  };
  const bool qwen2 = m.family == "qwen2_vl";
  for (const Field& f : fields) {
    // Qwen2-VL's tower has no windows: window_size 0.
    const int64_t lo = qwen2 && std::string(f.name) == "window_size" ? 0 : 1;
    if (auto s = CheckInt(vp, f.name, f.value, lo, f.hi); !s.ok()) return s;
  }
  if (qwen2 && (v.window_size != 0 || !v.fullatt_block_indexes.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        vp, "window_size = ", v.window_size, " and ", v.fullatt_block_indexes.size(),
        " fullatt_block_indexes: Qwen2-VL's tower has no windows (both must be 0/empty)"));
  }
  if (qwen2 && v.intermediate_size % v.hidden_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        vp, "intermediate_size = ", v.intermediate_size, " must be a multiple of ", vp,
        "hidden_size = ", v.hidden_size, " (Qwen2-VL's integer mlp_ratio)"));
  }
  // The 2-D rotary embedding gives a quarter of each head's dimensions to the row and a quarter
  // to the column frequencies, each rotated as halves.
  if (v.hidden_size % v.num_heads != 0 || v.HeadDim() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        vp, "num_heads = ", v.num_heads, " must divide ", vp, "hidden_size = ", v.hidden_size,
        " into heads of a multiple of 4 dimensions (2-D rotary embedding)"));
  }
  if (VisionWindowed(v) && v.WindowMergedPatches() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        vp, "window_size = ", v.window_size, " must span at least one merged patch (",
        vp, "spatial_merge_size * ", vp, "patch_size = ", v.spatial_merge_size * v.patch_size,
        " pixels)"));
  }
  for (size_t i = 0; i < v.fullatt_block_indexes.size(); ++i) {
    const int64_t b = v.fullatt_block_indexes[i];
    if (b < 0 || b >= v.depth || (i > 0 && b <= v.fullatt_block_indexes[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          vp, "fullatt_block_indexes[", i, "] = ", b, " must be ascending block indices in [0, ",
          v.depth, ")"));
    }
  }
  if (v.out_hidden_size != m.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        vp, "out_hidden_size = ", v.out_hidden_size, " must equal ", prefix,
        "hidden_size = ", m.hidden_size, " (the merger feeds the language model)"));
  }
  if (!std::isfinite(v.rope_theta) || v.rope_theta <= 0 || v.rope_theta > 1e12) {
    return OutOfRange(vp, "rope_theta", v.rope_theta, 1, 1e12);
  }
  const std::pair<const char*, int64_t> ids[] = {
      {"image_token_id", m.image_token_id},
      {"video_token_id", m.video_token_id},
      {"vision_start_token_id", m.vision_start_token_id},
      {"vision_end_token_id", m.vision_end_token_id},
  };
  for (const auto& [name, id] : ids) {
    if (auto s = CheckInt(prefix, name, id, 0, m.vocab_size - 1); !s.ok()) return s;
  }
  int64_t sections = 0;
  for (int64_t s : m.mrope_section) sections += s > 0 ? s : 0;
  bool positive = true;
  for (int64_t s : m.mrope_section) positive = positive && s > 0;
  if (m.mrope_section.size() != 3 || !positive || sections != m.HeadDim() / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "mrope_section = [", absl::StrJoin(m.mrope_section, ", "),
        "] must be three positive sizes (temporal, height, width) summing to head_dim / 2 = ",
        m.HeadDim() / 2));
  }
  if (m.sliding_window > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "sliding_window = ", m.sliding_window, " is not supported for family ",
        Quote(m.family), " (transformers computes full attention there outside flash-attention)"));
  }
  return absl::OkStatus();
}

// Gemma's fields: non-negative, finite, and only on the Gemma families (other families would
// silently ignore them); a Gemma model's padding row inside its vocabulary.
absl::Status ValidateGemma(const ModelSpec& m, absl::string_view prefix) {
  const std::pair<const char*, double> fields[] = {
      {"query_pre_attn_scalar", m.query_pre_attn_scalar},
      {"attn_logit_softcapping", m.attn_logit_softcapping},
      {"final_logit_softcapping", m.final_logit_softcapping},
  };
  for (const auto& [name, value] : fields) {
    if (!std::isfinite(value) || value < 0 || value > 1e6) {
      return OutOfRange(prefix, name, value, 0, 1e6);
    }
    if (value != 0 && !m.IsGemma()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, name, " = ", value, " is only supported for families gemma2, gemma3_text"));
    }
  }
  if (!std::isfinite(m.rope_local_base_freq) || m.rope_local_base_freq < 0 ||
      m.rope_local_base_freq > 1e12) {
    return OutOfRange(prefix, "rope_local_base_freq", m.rope_local_base_freq, 0, 1e12);
  }
  if (m.rope_local_base_freq != 0 && m.family != "gemma3_text") {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "rope_local_base_freq = ",
                                                   m.rope_local_base_freq,
                                                   " is only supported for family gemma3_text"));
  }
  if (m.embedding_padding_idx != -1) {
    if (!m.IsGemma()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "embedding_padding_idx = ", m.embedding_padding_idx,
          " is only supported for families gemma2, gemma3_text"));
    }
    if (auto s = CheckInt(prefix, "embedding_padding_idx", m.embedding_padding_idx, -1,
                          m.vocab_size - 1);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Quote(absl::string_view value) {
  if (value.size() <= kMaxQuotedBytes) return absl::StrCat("\"", value, "\"");
  return absl::StrCat("\"", value.substr(0, kMaxQuotedBytes), "\"... (", value.size(), " bytes)");
}

absl::Status CheckName(absl::string_view field, absl::string_view value) {
  return CheckBytes(field, value, kMaxNameBytes);
}

absl::Status CheckId(absl::string_view field, absl::string_view value) {
  return CheckBytes(field, value, kMaxIdBytes);
}

absl::Status CheckNote(absl::string_view field, absl::string_view value) {
  return CheckBytes(field, value, kMaxNoteBytes);
}

absl::Status CheckListSize(absl::string_view field, size_t size, size_t max_size) {
  if (size <= max_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " has ", size, " entries; allowed at most ", max_size));
}

absl::Status ValidateModelSpec(const ModelSpec& m, absl::string_view prefix) {
  if (auto s = CheckInt(prefix, "hidden_size", m.hidden_size, 1, kMaxHiddenSize); !s.ok()) return s;
  if (auto s = CheckInt(prefix, "num_layers", m.num_layers, 1, kMaxLayers); !s.ok()) return s;
  if (auto s = CheckInt(prefix, "num_heads", m.num_heads, 1, kMaxHeads); !s.ok()) return s;
  if (auto s = CheckInt(prefix, "num_kv_heads", m.num_kv_heads, 1, m.num_heads); !s.ok()) return s;
  if (m.num_heads % m.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "num_kv_heads = ", m.num_kv_heads, " must divide ", prefix,
        "num_heads = ", m.num_heads));
  }
  if (m.head_dim == 0 && m.hidden_size % m.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "num_heads = ", m.num_heads, " must divide ", prefix,
        "hidden_size = ", m.hidden_size, " (or set head_dim)"));
  }
  if (auto s = CheckInt(prefix, "head_dim", m.head_dim, 0, 4096); !s.ok()) return s;
  if (m.HeadDim() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "head_dim = ", m.HeadDim(), " must be even (rotary embeddings)"));
  }
  if (auto s = CheckInt(prefix, "intermediate_size", m.intermediate_size, 1, kMaxIntermediateSize);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckInt(prefix, "vocab_size", m.vocab_size, 1, kMaxVocabSize); !s.ok()) return s;
  const bool moe_family = m.family == "qwen3_moe" || m.family == "mixtral";
  const bool vl_family = m.family == "qwen2_5_vl" || m.family == "qwen2_vl";
  if (!(m.family == "llama" || m.family == "qwen2" || m.family == "qwen3" ||
        m.family == "mistral" || moe_family || vl_family || m.IsGemma())) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "family = ", Quote(m.family),
                                                   " is not supported; allowed: llama, qwen2, "
                                                   "qwen3, mistral, qwen3_moe, mixtral, "
                                                   "qwen2_5_vl, qwen2_vl, gemma2, gemma3_text"));
  }
  if (auto s = ValidateGemma(m, prefix); !s.ok()) return s;
  if (vl_family != m.IsVisionLanguage()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "vision.depth = ", m.vision.depth, vl_family ? " must be >= 1" : " must be 0",
        " for family ", Quote(m.family)));
  }
  if (vl_family) {
    if (auto s = ValidateVisionLanguage(m, prefix); !s.ok()) return s;
  }
  if (moe_family != (m.num_experts > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "num_experts = ", m.num_experts, moe_family ? " must be >= 1" : " must be 0",
        " for family ", Quote(m.family)));
  }
  if (m.num_experts > 0) {
    if (auto s = CheckInt(prefix, "num_experts", m.num_experts, 1, kMaxExperts); !s.ok()) return s;
    if (auto s = CheckInt(prefix, "num_experts_per_tok", m.num_experts_per_tok, 1, m.num_experts);
        !s.ok()) {
      return s;
    }
    if (auto s = CheckInt(prefix, "moe_intermediate_size", m.moe_intermediate_size, 1,
                          kMaxIntermediateSize);
        !s.ok()) {
      return s;
    }
    if (auto s = CheckInt(prefix, "decoder_sparse_step", m.decoder_sparse_step, 1, kMaxLayers);
        !s.ok()) {
      return s;
    }
    for (int64_t l : m.mlp_only_layers) {
      if (auto s = CheckInt(prefix, "mlp_only_layers[]", l, 0, m.num_layers - 1); !s.ok()) return s;
    }
    if (!std::isfinite(m.router_aux_loss_coef) || m.router_aux_loss_coef < 0 ||
        m.router_aux_loss_coef > 1e3) {
      return OutOfRange(prefix, "router_aux_loss_coef", m.router_aux_loss_coef, 0, 1e3);
    }
  }
  if (!std::isfinite(m.rms_norm_eps) || m.rms_norm_eps <= 0 || m.rms_norm_eps > 1) {
    return OutOfRange(prefix, "rms_norm_eps", m.rms_norm_eps, 1e-12, 1);
  }
  if (!std::isfinite(m.rope_theta) || m.rope_theta <= 0 || m.rope_theta > 1e12) {
    return OutOfRange(prefix, "rope_theta", m.rope_theta, 1, 1e12);
  }
  const RopeScaling& r = m.rope_scaling;
  if (!(r.type == "default" || r.type == "linear" || r.type == "dynamic" || r.type == "yarn" ||
        r.type == "llama3")) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "rope_scaling.type = ", Quote(r.type),
                     " is not supported; allowed: default, linear, dynamic, yarn, llama3"));
  }
  if (!std::isfinite(r.factor) || r.factor <= 0 || r.factor > 1e6) {
    return OutOfRange(prefix, "rope_scaling.factor", r.factor, 1e-6, 1e6);
  }
  if ((r.type == "llama3" || r.type == "yarn") && r.original_max_position_embeddings < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "rope_scaling.original_max_position_embeddings = ",
                     r.original_max_position_embeddings, " must be >= 1 for ", r.type));
  }
  if (r.type == "llama3" && !(r.high_freq_factor > r.low_freq_factor && r.low_freq_factor > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "rope_scaling: llama3 needs 0 < low_freq_factor < high_freq_factor, got ",
        r.low_freq_factor, " and ", r.high_freq_factor));
  }
  if (auto s = CheckInt(prefix, "sliding_window", m.sliding_window, 0, int64_t{1} << 31);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckListSize(absl::StrCat(prefix, "sliding_layers"), m.sliding_layers.size(),
                             static_cast<size_t>(kMaxLayers));
      !s.ok()) {
    return s;
  }
  if ((m.sliding_window > 0) != !m.sliding_layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "sliding_layers lists ", m.sliding_layers.size(), " layers with sliding_window = ",
        m.sliding_window, "; a window needs the layers that slide, and layers need a window"));
  }
  for (size_t i = 0; i < m.sliding_layers.size(); ++i) {
    const int64_t l = m.sliding_layers[i];
    if (l < 0 || l >= m.num_layers || (i > 0 && l <= m.sliding_layers[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "sliding_layers[", i, "] = ", l, " must be ascending layer indices in [0, ",
          m.num_layers, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSequenceLength(const ModelSpec& m, int64_t seq_len) {
  if (auto s = CheckInt("", "sequence length", seq_len, 1, kMaxSeqLen); !s.ok()) return s;
  if (auto s = CheckInt("config.json ", "sliding_window", m.sliding_window, 0, int64_t{1} << 31);
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateImagesForModel(const ModelSpec& m, const Workload& w,
                                    absl::string_view arch_prefix,
                                    absl::string_view workload_prefix) {
  if (!m.IsVisionLanguage() && w.images_per_sample > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        workload_prefix, "images_per_sample = ", w.images_per_sample, ": ", arch_prefix,
        "family = ", Quote(m.family), " has no vision tower"));
  }
  if (m.IsVisionLanguage() && w.images_per_sample == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        workload_prefix, "images_per_sample is required for the vision-language ", arch_prefix,
        "family = ", Quote(m.family), ", with ", workload_prefix, "image_height and image_width "
        "(pixels): a plan without them would count the language model only"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWorkload(const Workload& w, absl::string_view prefix) {
  if (auto s = CheckInt(prefix, "micro_batch", w.micro_batch, 1, kMaxMicroBatch); !s.ok()) return s;
  if (auto s = CheckInt(prefix, "seq_len", w.seq_len, 1, kMaxSeqLen); !s.ok()) return s;
  if (auto s = CheckInt(prefix, "world_size", w.world_size, 1, kMaxWorldSize); !s.ok()) return s;
  if (auto s = CheckInt(prefix, "grad_accum", w.grad_accum, 1, kMaxGradAccum); !s.ok()) return s;
  // 0 = world_size (one node).
  if (auto s = CheckInt(prefix, "local_world_size", w.local_world_size, 0, w.world_size); !s.ok()) {
    return s;
  }
  if (auto s = CheckInt(prefix, "images_per_sample", w.images_per_sample, 0, kMaxImagesPerSample);
      !s.ok()) {
    return s;
  }
  for (const auto& [field, pixels] : {std::pair<const char*, int64_t>{"image_height", w.image_height},
                                      {"image_width", w.image_width}}) {
    if (w.images_per_sample == 0 && pixels != 0) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, field, " = ", pixels, " needs ",
                                                     prefix, "images_per_sample >= 1"));
    }
    if (w.images_per_sample > 0) {
      if (auto s = CheckInt(prefix, field, pixels, 1, 65536); !s.ok()) return s;
    }
  }
  if (w.micro_batch * w.seq_len > (int64_t{1} << 28)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "micro_batch * ", prefix, "seq_len = ", w.micro_batch * w.seq_len,
        " tokens is out of range; allowed [1, ", int64_t{1} << 28, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateHardwareSpec(const HardwareSpec& h, absl::string_view prefix) {
  if (auto s = CheckName(absl::StrCat(prefix, "name"), h.name); !s.ok()) return s;
  if (auto s = CheckInt(prefix, "gpu_memory_bytes", h.gpu_memory_bytes, int64_t{1} << 20,
                        kMaxGpuMemoryBytes);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckInt(prefix, "cuda_context_bytes", h.cuda_context_bytes, 0,
                        h.gpu_memory_bytes - 1);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "gpu_memory_bytes = ", h.gpu_memory_bytes, " is below the CUDA context (",
        prefix, "cuda_context_bytes = ", h.cuda_context_bytes,
        "); the usable capacity must be positive"));
  }
  struct Rate {
    const char* field;
    double value;
    bool required;
  };
  const Rate rates[] = {
      {"h2d_pinned_bytes_per_second", h.h2d_pinned_bytes_per_second, true},
      {"d2h_pinned_bytes_per_second", h.d2h_pinned_bytes_per_second, true},
      {"h2d_pageable_bytes_per_second", h.h2d_pageable_bytes_per_second, true},
      {"d2h_pageable_bytes_per_second", h.d2h_pageable_bytes_per_second, true},
      {"bidirectional_pinned_bytes_per_second", h.bidirectional_pinned_bytes_per_second, false},
      {"hbm_bytes_per_second", h.hbm_bytes_per_second, true},
      {"matmul_bf16_flops", h.matmul_bf16_flops, true},
      {"matmul_fp16_flops", h.matmul_fp16_flops, false},
      {"matmul_fp32_flops", h.matmul_fp32_flops, true},
      {"nccl_allgather_bytes_per_second", h.nccl_allgather_bytes_per_second, false},
      {"nccl_reduce_scatter_bytes_per_second", h.nccl_reduce_scatter_bytes_per_second, false},
      {"nccl_allgather_under_compute_bytes_per_second",
       h.nccl_allgather_under_compute_bytes_per_second, false},
      {"nccl_reduce_scatter_under_compute_bytes_per_second",
       h.nccl_reduce_scatter_under_compute_bytes_per_second, false},
      {"cpu_adam_params_per_second", h.cpu_adam_params_per_second, true},
      {"nf4_dequant_bytes_per_second", h.nf4_dequant_bytes_per_second, false},
      {"cpu_adamw8bit_params_per_second", h.cpu_adamw8bit_params_per_second, false},
      {"cpu_grad_accumulate_params_per_second", h.cpu_grad_accumulate_params_per_second, false},
      {"cpu_adam_update_params_per_second", h.cpu_adam_update_params_per_second, false},
      {"cpu_adamw_bf16_params_per_second", h.cpu_adamw_bf16_params_per_second, false},
      {"cpu_sgd_params_per_second", h.cpu_sgd_params_per_second, false},
  };
  for (const Rate& r : rates) {
    if (auto s = CheckRate(prefix, r.field, r.value, r.required); !s.ok()) return s;
  }
  if (auto s = CheckInt(prefix, "host_memory_bytes", h.host_memory_bytes, int64_t{1} << 20,
                        kMaxHostMemoryBytes);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckInt(prefix, "pinned_limit_bytes", h.pinned_limit_bytes, 0, kMaxHostMemoryBytes);
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

absl::Status CheckHeadChunkLogitBytes(absl::string_view field, int64_t bytes) {
  if (bytes == 0 || (bytes >= kMinHeadChunkLogitBytes && bytes <= kMaxHeadChunkLogitBytes)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, " = ", bytes, " is out of range; allowed 0 (", kHeadChunkLogitBytes >> 20,
      " MiB) or [", kMinHeadChunkLogitBytes, ", ", kMaxHeadChunkLogitBytes, "] (1 MiB to 4 GiB)"));
}

absl::Status CheckHostMemoryOverride(absl::string_view field, int64_t bytes) {
  constexpr int64_t kLo = kMinHostMemoryGiB << 30;
  constexpr int64_t kHi = kMaxHostMemoryGiB << 30;
  if (bytes == 0 || (bytes >= kLo && bytes <= kHi)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " = ", bytes, " is out of range; allowed 0 (the hardware's) or [", kLo, ", ", kHi,
      "] (", kMinHostMemoryGiB, " to ", kMaxHostMemoryGiB, " GiB)"));
}

absl::Status CheckMoeAdapters(const ModelSpec& m, bool nf4_base,
                              const std::vector<std::string>& targets, absl::string_view prefix) {
  if (!m.IsMoe()) return absl::OkStatus();
  if (nf4_base) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "QLoRA (an NF4 base) is not supported for the mixture of experts ",
        Quote(m.family), "; use LoRA on q_proj, k_proj, v_proj, o_proj or a full fine-tune"));
  }
  for (const std::string& name : targets) {
    if (name == "gate_proj" || name == "up_proj" || name == "down_proj") {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "LoRA target ", Quote(name), " is not supported for the mixture of experts ",
          Quote(m.family), " (adapters on experts are not implemented); allowed: q_proj, k_proj, "
          "v_proj, o_proj"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckVisionAdapters(const ModelSpec& m, bool nf4_base,
                                 const std::vector<std::string>& targets,
                                 absl::string_view prefix) {
  if (!m.IsVisionLanguage()) return absl::OkStatus();
  if (nf4_base) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "QLoRA (an NF4 base) is not supported for the vision-language ", Quote(m.family),
        " yet; use LoRA on q_proj, k_proj, v_proj, o_proj or a full fine-tune"));
  }
  for (const std::string& name : targets) {
    if (name == "gate_proj" || name == "up_proj" || name == "down_proj") {
      // Qwen2-VL's tower names its MLP fc1/fc2, so there the name is not ambiguous; adapters on
      // the language model's MLP of a vision-language model are simply not implemented.
      const std::string why =
          VisionGatedMlp(m)
              ? absl::StrCat("PEFT's ", name, " also names the vision tower's visual.blocks.N.mlp.",
                             name, ", whose adapters are not implemented")
              : std::string("adapters on its MLP are not implemented");
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "LoRA target ", Quote(name), " is not supported for the vision-language ",
          Quote(m.family), ": ", why, "; allowed: q_proj, k_proj, v_proj, o_proj"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTrainingMethod(const TrainingMethod& t, const ModelSpec& m,
                                    absl::string_view prefix) {
  if (auto s = CheckListSize(absl::StrCat(prefix, "lora_target_modules"),
                             t.lora_target_modules.size(), kMaxLoraTargetModules);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckListSize(absl::StrCat(prefix, "osft_target_modules"),
                             t.osft_target_modules.size(), kLoraModules.size());
      !s.ok()) {
    return s;
  }
  if (t.kind == TrainingKind::kOsft) return ValidateOsftMethod(t, m, prefix);
  if (t.kind == TrainingKind::kFull) return absl::OkStatus();
  if (auto s = CheckInt(prefix, "lora_rank", t.lora_rank, 1, m.hidden_size); !s.ok()) return s;
  const std::string allowed = absl::StrJoin(kLoraModules, ", ");
  if (t.lora_target_modules.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "lora_target_modules is empty; allowed: ", allowed));
  }
  for (const std::string& name : t.lora_target_modules) {
    if (std::find(kLoraModules.begin(), kLoraModules.end(), name) == kLoraModules.end()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "lora_target_modules has ",
                                                     Quote(name), "; allowed: ", allowed));
    }
  }
  if (auto s = CheckMoeAdapters(m, t.kind == TrainingKind::kQlora, t.lora_target_modules, prefix);
      !s.ok()) {
    return s;
  }
  return CheckVisionAdapters(m, t.kind == TrainingKind::kQlora, t.lora_target_modules, prefix);
}

}  // namespace memplan
