// What the CUDA kernels share (agent/chunks, agent/model, agent/quant): scalar conversions (a
// 16-bit or fp32 value to fp32, and fp32 back rounded to nearest-even, as PyTorch's casts round)
// and the element-wise kernels' vector packs and grid size. Included by .cu files, never by a
// Torch translation unit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

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

}  // namespace memplan::cuda
