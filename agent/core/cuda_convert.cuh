// Scalar conversions the CUDA kernels share (agent/chunks, agent/model, agent/quant): a 16-bit or
// fp32 value to fp32, and fp32 back rounded to nearest-even, as PyTorch's casts round. Device code
// only; included by .cu files, never by a Torch translation unit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

}  // namespace memplan::cuda
