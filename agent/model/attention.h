// Causal self-attention of one decoder layer on q, k, v after RoPE, full or within a sliding
// window, in two flavours that share one tiled autograd function (attention.cc):
//  - CausalAttention: SDPA's kernels, the Llama-family layers. A sequence longer than the window
//    runs in query tiles under a band mask ([Sliding-window tiles], common/sliding_window.h).
//  - SoftcapAttention: transformers' eager math with Gemma 2's optional tanh cap of the scores,
//    always in query tiles ([Soft-capped attention tiles], common/softcap_attention.h).
#pragma once

#include <cstdint>

#include "agent/core/torch_pch.h"

namespace memplan {

// q: [batch, heads, seq, head_dim]; k, v: [batch, kv_heads, seq, head_dim] with heads a multiple
// of kv_heads (grouped-query attention). Returns [batch, heads, seq, head_dim] in q's dtype.
// window 0: full causal attention (SDPA's causal kernel); window W > 0: the query at i sees the
// keys j with i - W < j <= i, as SDPA's causal kernel when seq <= W and in tiles beyond.
// Differentiable in q, k and v; the forward is deterministic given its inputs, so a recomputed
// block reproduces it.
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, int64_t window);

// Same shapes and window rule; scores are q kᵀ · scale, capped as tanh(s / softcap) · softcap when
// softcap > 0, softmax in fp32. The result is stored as [batch, seq, heads, head_dim]. tile_rows
// > 0 forces tiles of that many queries (tests); 0 takes SoftcapTileRows(), what the planner
// prices. Differentiable and deterministic as CausalAttention.
torch::Tensor SoftcapAttention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t window, double scale, double softcap,
                               int64_t tile_rows = 0);

}  // namespace memplan
