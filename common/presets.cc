#include "common/presets.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/optimizer_bytes.h"

namespace memplan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

ModelSpec Model(std::string name, std::string family, int64_t hidden, int64_t layers, int64_t heads,
                int64_t kv_heads, int64_t intermediate, int64_t vocab, bool tie, int64_t head_dim,
                double rope_theta) {
  ModelSpec m;
  m.name = std::move(name);
  m.family = std::move(family);
  m.hidden_size = hidden;
  m.num_layers = layers;
  m.num_heads = heads;
  m.num_kv_heads = kv_heads;
  m.intermediate_size = intermediate;
  m.vocab_size = vocab;
  m.tie_word_embeddings = tie;
  m.head_dim = head_dim;
  m.rope_theta = rope_theta;
  m.qkv_bias = m.family == "qwen2";
  m.qk_norm = m.family == "qwen3";
  m.rms_norm_eps = m.family == "llama" ? 1e-5 : 1e-6;
  return m;
}

// A mixture of experts as its config.json publishes it: every layer sparse (decoder_sparse_step 1,
// no mlp_only_layers), the load-balancing loss off as output_router_logits is false there.
ModelSpec WithExperts(ModelSpec m, int64_t experts, int64_t top_k, int64_t expert_intermediate,
                      bool norm_topk_prob, double aux_coef) {
  m.num_experts = experts;
  m.num_experts_per_tok = top_k;
  m.moe_intermediate_size = expert_intermediate;
  m.norm_topk_prob = norm_topk_prob;
  m.router_aux_loss_coef = aux_coef;
  return m;
}

ModelSpec Qwen3MoeModel(std::string name, int64_t hidden, int64_t layers, int64_t heads,
                        int64_t kv_heads, int64_t intermediate, int64_t experts, int64_t top_k,
                        int64_t expert_intermediate) {
  ModelSpec m = WithExperts(Model(std::move(name), "qwen3_moe", hidden, layers, heads, kv_heads,
                                  intermediate, 151936, false, 128, 1000000),
                            experts, top_k, expert_intermediate, true, 0.001);
  m.qk_norm = true;  // as the dense Qwen3 models
  return m;
}

ModelSpec MixtralModel(std::string name, int64_t hidden, int64_t layers, int64_t heads,
                       int64_t kv_heads, int64_t intermediate, int64_t experts, int64_t top_k) {
  // Mixtral's experts are as wide as intermediate_size; its top-k weights are always
  // renormalised and its RMSNorm epsilon is Llama's.
  ModelSpec m = WithExperts(Model(std::move(name), "mixtral", hidden, layers, heads, kv_heads,
                                  intermediate, 32000, false, 128, 1000000),
                            experts, top_k, intermediate, true, 0.02);
  m.rms_norm_eps = 1e-5;
  return m;
}

// Qwen2.5-VL as its config.json publishes it: Qwen2.5's language model (qkv biases, M-RoPE in
// sections 16/24/24 of the 64 rotary frequencies) and a 32-block vision tower of width 1280
// (windows of 112 pixels, full attention at blocks 7, 15, 23, 31).
ModelSpec Qwen25VlModel(std::string name, int64_t hidden, int64_t layers, int64_t heads,
                        int64_t kv_heads, int64_t intermediate, int64_t vocab, bool tie) {
  ModelSpec m = Model(std::move(name), "qwen2_5_vl", hidden, layers, heads, kv_heads,
                      intermediate, vocab, tie, 128, 1000000);
  m.qkv_bias = true;
  m.max_position_embeddings = 128000;
  m.image_token_id = 151655;
  m.video_token_id = 151656;
  m.vision_start_token_id = 151652;
  m.vision_end_token_id = 151653;
  m.mrope_section = {16, 24, 24};
  VisionSpec& v = m.vision;
  v.depth = 32;
  v.hidden_size = 1280;
  v.intermediate_size = 3420;
  v.num_heads = 16;
  v.out_hidden_size = hidden;
  v.fullatt_block_indexes = {7, 15, 23, 31};
  return m;
}

// Qwen2-VL as its config.json publishes it: the same language model as Qwen2.5-VL's (32768
// positions) and a 32-block tower of width 1280 with LayerNorm, a QuickGELU MLP 4x wide and no
// windows, merged into the language model's width.
ModelSpec Qwen2VlModel(std::string name, int64_t hidden, int64_t layers, int64_t heads,
                       int64_t kv_heads, int64_t intermediate, int64_t vocab, bool tie) {
  ModelSpec m = Qwen25VlModel(std::move(name), hidden, layers, heads, kv_heads, intermediate,
                              vocab, tie);
  m.family = "qwen2_vl";
  m.max_position_embeddings = 32768;
  VisionSpec& v = m.vision;
  v.intermediate_size = 4 * v.hidden_size;
  v.window_size = 0;
  v.fullatt_block_indexes.clear();
  return m;
}

// Gemma 2 as its config.json publishes it: tied embeddings over a 256 000-token vocabulary,
// head_dim apart from the width, every even layer sliding within 4 096 tokens, attention scores
// capped at 50 and logits at 30, the padding row 0.
ModelSpec Gemma2Model(std::string name, int64_t hidden, int64_t layers, int64_t heads,
                      int64_t kv_heads, int64_t intermediate, int64_t head_dim,
                      double query_pre_attn_scalar) {
  ModelSpec m = Model(std::move(name), "gemma2", hidden, layers, heads, kv_heads, intermediate,
                      256000, true, head_dim, 10000);
  m.max_position_embeddings = 8192;
  m.query_pre_attn_scalar = query_pre_attn_scalar;
  m.attn_logit_softcapping = 50.0;
  m.final_logit_softcapping = 30.0;
  m.embedding_padding_idx = 0;
  m.sliding_window = 4096;
  for (int64_t l = 0; l < layers; l += 2) m.sliding_layers.push_back(l);
  return m;
}

// Gemma 3's text decoder as its config.json publishes it (the text_config from 4B up): Gemma 2's
// preset with q/k norms and no caps, five layers sliding within `window` tokens on RoPE base
// 10 000 to each full one on rope_theta 1e6, linearly scaled by `rope_factor` from 4B up
// (131 072 positions; 1B: 32 768, unscaled).
ModelSpec Gemma3Model(std::string name, int64_t hidden, int64_t layers, int64_t heads,
                      int64_t kv_heads, int64_t intermediate, int64_t head_dim,
                      double query_pre_attn_scalar, int64_t vocab, int64_t window,
                      double rope_factor) {
  ModelSpec m = Gemma2Model(std::move(name), hidden, layers, heads, kv_heads, intermediate,
                            head_dim, query_pre_attn_scalar);
  m.family = "gemma3_text";
  m.vocab_size = vocab;
  m.qk_norm = true;
  m.attn_logit_softcapping = 0;
  m.final_logit_softcapping = 0;
  m.rope_theta = 1e6;
  m.rope_local_base_freq = 1e4;
  m.max_position_embeddings = rope_factor > 1 ? 131072 : 32768;
  if (rope_factor > 1) {
    m.rope_scaling.type = "linear";
    m.rope_scaling.factor = rope_factor;
  }
  m.sliding_window = window;
  m.sliding_layers.clear();
  for (int64_t l = 0; l < layers; ++l) {
    if ((l + 1) % 6 != 0) m.sliding_layers.push_back(l);
  }
  return m;
}

// Llama 3.1 / 3.2 checkpoints extend their 8192-token pre-training context with llama3 RoPE
// scaling (factor 8 for 3.1, 32 for 3.2), as their config.json files say.
ModelSpec WithLlama3Rope(ModelSpec m, double factor) {
  m.rope_scaling.type = "llama3";
  m.rope_scaling.factor = factor;
  m.rope_scaling.low_freq_factor = 1.0;
  m.rope_scaling.high_freq_factor = 4.0;
  m.rope_scaling.original_max_position_embeddings = 8192;
  return m;
}

std::vector<ModelSpec> BuildModelPresets() {
  return {
      // A tiny config for demos and CPU tests.
      Model("llama-tiny", "llama", 256, 4, 8, 4, 688, 2048, false, 0, 500000),
      WithLlama3Rope(
          Model("llama-3.2-1b", "llama", 2048, 16, 32, 8, 8192, 128256, true, 64, 500000),
          32),
      WithLlama3Rope(
          Model("llama-3.2-3b", "llama", 3072, 28, 24, 8, 8192, 128256, true, 128, 500000),
          32),
      WithLlama3Rope(
          Model("llama-3.1-8b", "llama", 4096, 32, 32, 8, 14336, 128256, false, 128, 500000),
          8),
      WithLlama3Rope(
          Model("llama-3.1-70b", "llama", 8192, 80, 64, 8, 28672, 128256, false, 128, 500000),
          8),
      WithLlama3Rope(
          Model("llama-3.1-405b", "llama", 16384, 126, 128, 8, 53248, 128256, false, 128, 500000),
          8),
      Model("qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 4864, 151936, true, 64, 1000000),
      Model("qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 8960, 151936, true, 128, 1000000),
      Model("qwen2.5-3b", "qwen2", 2048, 36, 16, 2, 11008, 151936, true, 128, 1000000),
      Model("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, false, 128, 1000000),
      Model("qwen2.5-14b", "qwen2", 5120, 48, 40, 8, 13824, 152064, false, 128, 1000000),
      Model("qwen2.5-32b", "qwen2", 5120, 64, 40, 8, 27648, 152064, false, 128, 1000000),
      Model("qwen2.5-72b", "qwen2", 8192, 80, 64, 8, 29568, 152064, false, 128, 1000000),
      Model("qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 3072, 151936, true, 128, 1000000),
      Model("qwen3-1.7b", "qwen3", 2048, 28, 16, 8, 6144, 151936, true, 128, 1000000),
      Model("qwen3-4b", "qwen3", 2560, 36, 32, 8, 9728, 151936, true, 128, 1000000),
      Model("qwen3-8b", "qwen3", 4096, 36, 32, 8, 12288, 151936, false, 128, 1000000),
      Model("qwen3-14b", "qwen3", 5120, 40, 40, 8, 17408, 151936, false, 128, 1000000),
      Model("qwen3-32b", "qwen3", 5120, 64, 64, 8, 25600, 151936, false, 128, 1000000),
      Model("mistral-7b", "mistral", 4096, 32, 32, 8, 14336, 32768, false, 128, 1000000),
      Qwen3MoeModel("qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 128, 8, 768),
      MixtralModel("mixtral-8x7b", 4096, 32, 32, 8, 14336, 8, 2),
      // Planned with its images (workload.images_per_sample and the image size).
      Qwen25VlModel("qwen2.5-vl-7b", 3584, 28, 28, 4, 18944, 152064, false),
      Qwen2VlModel("qwen2-vl-7b", 3584, 28, 28, 4, 18944, 152064, false),
      Gemma2Model("gemma-2-2b", 2304, 26, 8, 4, 9216, 256, 256),
      Gemma2Model("gemma-2-9b", 3584, 42, 16, 8, 14336, 256, 256),
      Gemma2Model("gemma-2-27b", 4608, 46, 32, 16, 36864, 128, 144),
      // Text decoders only (4B and up are published as Gemma3ForConditionalGeneration).
      Gemma3Model("gemma-3-1b", 1152, 26, 4, 1, 6912, 256, 256, 262144, 512, 1.0),
      Gemma3Model("gemma-3-4b", 2560, 34, 8, 4, 10240, 256, 256, 262208, 1024, 8.0),
      Gemma3Model("gemma-3-12b", 3840, 48, 16, 8, 15360, 256, 256, 262208, 1024, 8.0),
      Gemma3Model("gemma-3-27b", 5376, 62, 32, 16, 21504, 128, 168, 262208, 1024, 8.0),
  };
}

// Published figures: memory as the driver reports it, peak dense matmul (no sparsity),
// link rates as commonly measured with pinned memory. H200 link rates are the ones measured
// on our GPU host (docs/benchmarks.md); other cards scale by their PCIe generation.
HardwareSpec Card(std::string name, int64_t memory_mib, double hbm_tbps, double bf16_tflops,
                  double fp32_tflops, int pcie_gen, double nccl_gbps, int64_t host_gib,
                  double cpu_adam_gparams) {
  HardwareSpec h;
  h.name = std::move(name);
  h.gpu_memory_bytes = memory_mib * kMiB;
  h.cuda_context_bytes = 512 * kMiB;
  const double pinned = pcie_gen >= 5 ? 55.0e9 : (pcie_gen == 4 ? 25.0e9 : 12.0e9);
  h.h2d_pinned_bytes_per_second = pinned;
  h.d2h_pinned_bytes_per_second = pinned;
  h.h2d_pageable_bytes_per_second = pinned * (7.5 / 55.4);
  h.d2h_pageable_bytes_per_second = pinned * (15.3 / 55.2);
  h.bidirectional_pinned_bytes_per_second = pinned * 1.6;
  h.hbm_bytes_per_second = hbm_tbps * 1e12;
  h.matmul_bf16_flops = bf16_tflops * 1e12;
  h.matmul_fp16_flops = bf16_tflops * 1e12;
  h.matmul_fp32_flops = fp32_tflops * 1e12;
  h.nccl_allgather_bytes_per_second = nccl_gbps * 1e9;
  h.nccl_reduce_scatter_bytes_per_second = nccl_gbps * 1e9;
  h.cpu_adam_params_per_second = cpu_adam_gparams * 1e9;
  // [Two CPU passes] (common/optimizer_bytes.h): the whole pass split by the bytes each part
  // moves, at the memory bandwidth the whole pass implies.
  h.cpu_grad_accumulate_params_per_second =
      h.cpu_adam_params_per_second * kCpuFusedPassBytesPerParam / kCpuAccumulateBytesPerParam;
  h.cpu_adam_update_params_per_second =
      h.cpu_adam_params_per_second * kCpuFusedPassBytesPerParam / kCpuUpdateBytesPerParam;
  h.host_memory_bytes = host_gib * kGiB;
  h.pinned_limit_bytes = 0;
  h.measured = false;
  return h;
}

std::vector<HardwareSpec> BuildHardwarePresets() {
  return {
      Card("a100-40gb", 40960, 1.555, 312, 19.5, 4, 230, 128, 1.0),
      Card("a100-80gb", 81920, 2.039, 312, 19.5, 4, 230, 256, 1.0),
      Card("h100-80gb", 81559, 3.35, 989, 67, 5, 370, 256, 1.5),
      Card("h200", 143771, 4.8, 989, 67, 5, 370, 256, 1.5),
      Card("l40s", 46068, 0.864, 362, 91.6, 4, 20, 128, 1.0),
      Card("rtx-3090", 24576, 0.936, 71, 35.6, 4, 20, 64, 0.5),
      Card("rtx-4090", 24564, 1.008, 165, 82.6, 4, 20, 64, 0.5),
  };
}

}  // namespace

const std::vector<ModelSpec>& ModelPresets() {
  static const auto* presets = new std::vector<ModelSpec>(BuildModelPresets());
  return *presets;
}

const std::vector<HardwareSpec>& HardwarePresets() {
  static const auto* presets = new std::vector<HardwareSpec>(BuildHardwarePresets());
  return *presets;
}

namespace {

// Levenshtein distance: insertions, deletions and substitutions cost one each.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

template <typename Spec>
std::vector<std::string> NamesOf(const std::vector<Spec>& presets) {
  std::vector<std::string> names;
  for (const Spec& p : presets) names.push_back(p.name);
  return names;
}

template <typename Spec>
std::optional<Spec> FindPreset(const std::vector<Spec>& presets, std::string_view text) {
  const std::string name = MatchPresetName(text, NamesOf(presets)).name;
  for (const Spec& p : presets) {
    if (!name.empty() && p.name == name) return p;
  }
  return std::nullopt;
}

std::string UnknownHint(std::string_view text, const std::vector<std::string>& names) {
  const PresetNameMatch match = MatchPresetName(text, names);
  if (!match.suggestion.empty()) return absl::StrCat("; did you mean ", match.suggestion, "?");
  return absl::StrCat("; known: ", absl::StrJoin(names, ", "));
}

}  // namespace

PresetNameMatch MatchPresetName(std::string_view text, const std::vector<std::string>& names) {
  PresetNameMatch match;
  for (const std::string& n : names) {
    if (n == text) {
      match.name = n;
      return match;
    }
  }
  // "meta-llama/Llama-3.1-8B" -> "llama-3.1-8b": the repo's name, lower case.
  std::string_view base = text;
  if (const size_t slash = base.rfind('/'); slash != std::string_view::npos) {
    base = base.substr(slash + 1);
  }
  const std::string folded = absl::AsciiStrToLower(std::string(base));
  for (const std::string& n : names) {
    if (absl::AsciiStrToLower(n) == folded) {
      match.name = n;
      return match;
    }
  }
  size_t best = std::string::npos;
  for (const std::string& n : names) {
    const size_t d = EditDistance(folded, absl::AsciiStrToLower(n));
    if (d < best) {
      best = d;
      match.suggestion = n;
    }
  }
  if (best > std::max<size_t>(2, folded.size() / 4)) match.suggestion.clear();
  return match;
}

std::optional<ModelSpec> FindModelPreset(std::string_view name) {
  return FindPreset(ModelPresets(), name);
}

std::optional<HardwareSpec> FindHardwarePreset(std::string_view name) {
  return FindPreset(HardwarePresets(), name);
}

std::string UnknownModelPresetHint(std::string_view text) {
  return UnknownHint(text, NamesOf(ModelPresets()));
}

std::string UnknownHardwarePresetHint(std::string_view text) {
  return UnknownHint(text, NamesOf(HardwarePresets()));
}

std::string ModelPresetNames() {
  return absl::StrJoin(ModelPresets(), ", ",
                       [](std::string* out, const ModelSpec& m) { out->append(m.name); });
}

std::string HardwarePresetNames() {
  return absl::StrJoin(HardwarePresets(), ", ",
                       [](std::string* out, const HardwareSpec& h) { out->append(h.name); });
}

}  // namespace memplan
