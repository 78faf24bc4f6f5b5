// [Fused RoPE] The rotary embedding out = x * cos + SwapHalves(x) * sin and its backward, each one
// pass over the tensors on the GPU (rope_kernel.cu), where eager PyTorch runs a flip copy, two
// multiplies and an add forward and as many backward. Every product and sum is rounded to the
// dtype where the eager ops round it, so the results are the eager ops' bit for bit (agent/model/
// rope.cc runs those ops on the CPU). CUDA-free interface; built only when the project found a
// CUDA compiler (MEMPLAN_ROPE_CUDA).
#pragma once

#include <cstdint>

#include "agent/core/kernel_dtype.h"

namespace memplan::model_cuda {

using cuda::KernelDtype;

// The shapes of one launch. x, out and the gradients are [batch, seq, heads, head_dim]
// contiguous; cos and sin are [table_batch, seq, head_dim] contiguous, table_batch 1 (one table
// for every row) or batch (one per row, M-RoPE). head_dim is even.
struct RopeShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t table_batch = 1;
};

// out = x * cos + SwapHalves(x) * sin, each product rounded to the dtype, then the sum.
// Launches on `stream` (a cudaStream_t); returns the cudaError_t of the launch (0 = success).
int LaunchRopeForward(const void* x, const void* cos, const void* sin, void* out,
                      const RopeShape& shape, KernelDtype dtype, void* stream);

// The adjoint: grad_x = grad * cos + SwapHalves(grad * sin), each product rounded to the dtype,
// then the sum.
int LaunchRopeBackward(const void* grad, const void* cos, const void* sin, void* grad_x,
                       const RopeShape& shape, KernelDtype dtype, void* stream);

}  // namespace memplan::model_cuda
