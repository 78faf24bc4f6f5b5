// Causal self-attention of one decoder layer, full or within a sliding window, on q, k, v after
// RoPE. The sliding case is exact (transformers' mask) and runs in O(seq · window) memory by
// query tiles ([Sliding-window tiles], common/sliding_window.h).
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
torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              int64_t window);

}  // namespace memplan
