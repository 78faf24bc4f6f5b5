// [Fused gate] The SwiGLU product silu(g) * u of a gated MLP and its backward, each one pass over
// the tensors on the GPU (gated_kernel.cu), where eager PyTorch runs two kernels forward (silu,
// mul) and three backward (two muls, silu_backward) and keeps silu(g) as a third tensor for
// backward.
// Every intermediate is rounded to the tensors' dtype exactly where the eager ops round it, so the
// results are those of the eager ops (agent/model/layers.cc, GatedProduct, runs them on the CPU).
// CUDA-free interface; built only when the project found a CUDA compiler (MEMPLAN_GATED_CUDA).
#pragma once

#include <cstdint>

#include "agent/core/kernel_dtype.h"

namespace memplan::model_cuda {

using cuda::KernelDtype;

// out = silu(g) * u, element-wise over n contiguous elements of `dtype`.
// Launches on `stream` (a cudaStream_t); returns the cudaError_t of the launch (0 = success).
int LaunchSiluGateForward(const void* g, const void* u, void* out, int64_t n, KernelDtype dtype,
                          void* stream);

// With s = silu(g) rounded to the dtype: grad_u = grad * s; grad_g = silu'(g) * (grad * u), the
// product rounded to the dtype before silu's backward, as the eager ops round it.
int LaunchSiluGateBackward(const void* grad, const void* g, const void* u, void* grad_g,
                           void* grad_u, int64_t n, KernelDtype dtype, void* stream);

}  // namespace memplan::model_cuda
