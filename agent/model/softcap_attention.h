// Gemma 2's causal self-attention: transformers' eager math (scale, optional tanh soft cap of the
// scores, full causal or sliding-window mask, fp32 softmax) in query tiles
// ([Soft-capped attention tiles], common/softcap_attention.h).
#pragma once

#include <cstdint>

#include "agent/core/torch_pch.h"

namespace memplan {

// q: [batch, heads, seq, head_dim]; k, v: [batch, kv_heads, seq, head_dim], heads a multiple of
// kv_heads. Returns [batch, heads, seq, head_dim] in q's dtype (stored as [batch, seq, heads,
// head_dim]). window 0: full causal attention; W > 0: the query at i sees the keys j with
// i - W < j <= i. softcap 0: no cap. Differentiable in q, k and v; forward is deterministic, so a
// recomputed block reproduces it. tile_rows > 0 forces tiles of that many queries (tests); 0
// takes SoftcapTileRows(), what the planner prices.
torch::Tensor SoftcapAttention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t window, double scale, double softcap,
                               int64_t tile_rows = 0);

}  // namespace memplan
