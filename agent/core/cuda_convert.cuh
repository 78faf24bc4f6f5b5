// What the CUDA kernels share (agent/chunks, agent/model, agent/quant): scalar conversions (a
// 16-bit or fp32 value to fp32, and fp32 back rounded to nearest-even, as PyTorch's casts round)
// and the element-wise kernels' vector packs and grid size. Included by .cu files, never by a
// Torch translation unit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "agent/core/kernel_dtype.h"

namespace memplan::cuda {

__device__ inline float ToFloat(float v) { return v; }
__device__ inline float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ T FromFloat(float v);
template <>
__device__ inline float FromFloat<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ inline __half FromFloat<__half>(float v) { return __float2half_rn(v); }

// kVec elements of T moved as one 16-byte load or store (kVec = 16 / sizeof(T)) where the launcher
// found the pointers 16-byte aligned; kVec = 1 otherwise.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Blocks of `threads` for a grid-stride loop over `items`: one item per thread, at most 65 535
// blocks (enough to fill any current GPU several times over; the loop strides past the rest).
inline unsigned GridBlocks(int64_t items, int threads) {
  const int64_t want = (items + threads - 1) / threads;
  return static_cast<unsigned>(want < 65535 ? (want > 0 ? want : 1) : 65535);
}

// A launcher's dtype switch: body(T{}) with T the element type of `dtype` (float, __nv_bfloat16,
// __half), returning what body returns (a cudaError_t). kFloat32 gives cudaErrorInvalidValue
// when the kernel takes 16-bit tensors only.
template <typename Body>
int DispatchDtype(KernelDtype dtype, Body body, bool sixteen_bit_only = false) {
  switch (dtype) {
    case KernelDtype::kFloat32:
      if (sixteen_bit_only) break;
      return body(float{});
    case KernelDtype::kBFloat16:
      return body(__nv_bfloat16{});
    case KernelDtype::kFloat16:
      return body(__half{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace memplan::cuda
