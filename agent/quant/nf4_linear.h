// A linear layer whose weight is NF4 (QLoRA's frozen base projections).
#pragma once

#include "agent/core/torch_pch.h"
#include "agent/quant/nf4.h"

namespace memplan::quant {

// y = x W^T (+ bias) with W = DequantizeNf4(w, x's dtype): W is dequantized right before the
// matmul and freed after it, and backward dequantizes it again for the input gradient, so no copy
// of W lives between forward and backward ([Dequantization transient], common/nf4_bytes.h). W and
// the bias take no gradient (a frozen base); x's gradient flows. Deterministic, so a recomputed
// forward (CKPT / HS_OFFLOAD blocks) gives the same bits. w's tensors are saved by handle: a chunk
// manager that swaps their storage (set_data) between forward and backward is seen by backward.
// Preconditions: ValidateNf4(w).ok(), x's last dimension = w.shape[1], w 2-D, on x's device.
torch::Tensor Nf4Linear(const torch::Tensor& x, const Nf4Tensor& w,
                        const torch::Tensor& bias = torch::Tensor());

}  // namespace memplan::quant
