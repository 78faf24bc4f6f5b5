// The element types memplan's CUDA kernels take, named without CUDA or Torch: a kernel's header is
// included by Torch translation units and its .cu file is compiled by nvcc alone, so neither side's
// dtype type can appear in the interface between them (agent/core/kernel_launch.h maps a tensor's).
#pragma once

namespace memplan::cuda {

enum class KernelDtype { kFloat32, kBFloat16, kFloat16 };

}  // namespace memplan::cuda
