// [Fused RoPE] The decoder's rotary embedding as one autograd Function, one kernel each way on CUDA
// (rope_kernel.cu) with the eager ops' roundings, the eager ops themselves elsewhere.
#pragma once

#include "agent/core/torch_pch.h"

namespace memplan {

// x * cos + SwapHalves(x) * sin (agent/model/layers.h) for x [batch, seq, heads, head_dim], in that
// layout (contiguous). cos and sin (the sin table's first half negated, LlamaModel::Rope) are
// [seq, head_dim], [table_batch, seq, head_dim] or [table_batch, 1, seq, head_dim] with table_batch
// 1 or batch, x's dtype and device, and never require grad; backward keeps only them. Values and
// gradient are the eager expression's bit for bit. A bad shape, dtype or device throws c10::Error.
torch::Tensor ApplyRope(const torch::Tensor& x_bshd, const torch::Tensor& cos,
                        const torch::Tensor& sin);

}  // namespace memplan
