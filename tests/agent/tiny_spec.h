// Tiny models for agent tests, fast on the CPU: a Llama-family one (4 blocks of hidden size 64;
// llama, qwen2, qwen3, gemma2 or gemma3_text) and a Qwen2.5-VL one.
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"

namespace memplan::testing {

inline ModelSpec TinySpec(bool tied = false, const std::string& family = "llama") {
  ModelSpec s;
  s.name = "tiny";
  s.family = family;
  s.hidden_size = 64;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 96;
  s.vocab_size = 128;
  s.rope_theta = 10000.0;
  s.tie_word_embeddings = tied;
  if (family == "qwen2") s.qkv_bias = true;
  if (family == "qwen3") s.qk_norm = true;
  if (family == "gemma2" || family == "gemma3_text") {
    // Gemma 2's own fields: a head_dim and an attention scale apart from hidden / heads, both
    // logit caps, a padding row, and a sliding window on the first layer only.
    s.head_dim = 48;
    s.query_pre_attn_scalar = 32;
    s.attn_logit_softcapping = 50;
    s.final_logit_softcapping = 30;
    s.embedding_padding_idx = 0;
    s.sliding_window = 16;
    s.sliding_layers = {0};
    s.rms_norm_eps = 1e-6;
  }
  if (family == "gemma3_text") {
    // Gemma 3: q/k norms, no attention cap, the sliding layer's RoPE on its own base.
    s.qk_norm = true;
    s.attn_logit_softcapping = 0;
    s.final_logit_softcapping = 0;
    s.rope_theta = 1e6;
    s.rope_local_base_freq = 1e4;
  }
  return s;
}

// Token ids of TinyVlSpec's vision markers.
inline constexpr int64_t kTinyVlImage = 90, kTinyVlVideo = 91, kTinyVlStart = 92, kTinyVlEnd = 93;

// A tiny Qwen2.5-VL: a 2-block language model of hidden size 32 (M-RoPE sections 2/1/1) and a
// vision tower of `vision_depth` blocks of hidden size 16 (patches of 2, windows of two merged
// patches a side, full attention at block 1).
inline ModelSpec TinyVlSpec(int64_t vision_depth) {
  ModelSpec s;
  s.name = "tiny-vl";
  s.family = "qwen2_5_vl";
  s.hidden_size = 32;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.intermediate_size = 48;
  s.vocab_size = 96;
  s.qkv_bias = true;
  s.rope_theta = 10000.0;
  s.rms_norm_eps = 1e-6;
  s.mrope_section = {2, 1, 1};
  s.image_token_id = kTinyVlImage;
  s.video_token_id = kTinyVlVideo;
  s.vision_start_token_id = kTinyVlStart;
  s.vision_end_token_id = kTinyVlEnd;
  VisionSpec& v = s.vision;
  v.depth = vision_depth;
  v.hidden_size = 16;
  v.intermediate_size = 24;
  v.num_heads = 2;
  v.patch_size = 2;
  v.spatial_merge_size = 2;
  v.temporal_patch_size = 2;
  v.window_size = 8;  // two merged patches a side
  v.out_hidden_size = 32;
  v.fullatt_block_indexes = {1};
  return s;
}

}  // namespace memplan::testing
