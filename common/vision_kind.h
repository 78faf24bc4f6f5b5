// Which of the two Qwen vision towers a vision-language ModelSpec has. Qwen2.5-VL's
// (family qwen2_5_vl): RMSNorm, a SwiGLU MLP, windowed attention with a few full-attention blocks.
// Qwen2-VL's (family qwen2_vl; transformers' Qwen2VLVisionConfig, whose embed_dim is
// VisionSpec::hidden_size, hidden_size is out_hidden_size, embed_dim · mlp_ratio is
// intermediate_size): LayerNorm with a bias, fc1 -> QuickGELU -> fc2, every block over each whole
// image (window_size 0, no fullatt_block_indexes). Torch-free.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace memplan {

// Block and merger norms are LayerNorm with a bias (else RMSNorm without one).
inline bool VisionLayerNorm(const ModelSpec& m) { return m.family == "qwen2_vl"; }
// The block MLP is SwiGLU gate/up/down (else fc1 -> QuickGELU -> fc2, in the up/down roles).
inline bool VisionGatedMlp(const ModelSpec& m) { return m.family != "qwen2_vl"; }
// Attention runs over windows of window_size pixels except in fullatt_block_indexes (else
// window_size is 0 and every block attends over each whole image).
inline bool VisionWindowed(const VisionSpec& v) { return v.window_size > 0; }
inline bool VisionFullAttentionBlock(const VisionSpec& v, int64_t block) {
  return !VisionWindowed(v) || v.IsFullAttentionBlock(block);
}

}  // namespace memplan
