// The Torch side of a launch of one of memplan's CUDA kernels (gated_kernel.cu, rope_kernel.cu,
// widened_sum_kernel.cu, shard_mean_kernel.cu): which tensors a kernel takes and in what
// KernelDtype, the current stream of a tensor's device, and the launch's error as a Torch error.
// Included only by translation units built with a kernel (their MEMPLAN_*_CUDA define), which
// LibTorch's CUDA headers then serve.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <optional>

#include "agent/core/kernel_dtype.h"

namespace memplan::cuda {

// A CUDA tensor's KernelDtype (fp32, bf16 or fp16); nullopt for any other tensor.
inline std::optional<KernelDtype> KernelDtypeOf(const torch::Tensor& t) {
  if (!t.defined() || !t.is_cuda()) return std::nullopt;
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return KernelDtype::kFloat32;
    case torch::kBFloat16:
      return KernelDtype::kBFloat16;
    case torch::kFloat16:
      return KernelDtype::kFloat16;
    default:
      return std::nullopt;
  }
}

// The current stream of t's device, as the kernels' launchers take it (a cudaStream_t).
inline void* CurrentStream(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// A launcher's cudaError_t (0 = success) as a Torch error naming the kernel.
inline void CheckLaunch(int err, const char* kernel) {
  TORCH_CHECK(err == 0, "the ", kernel, " kernel failed to launch: CUDA error ", err);
}

}  // namespace memplan::cuda
