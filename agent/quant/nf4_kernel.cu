#include "agent/quant/nf4_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "agent/core/cuda_convert.cuh"

namespace memplan::quant {
namespace {

// bitsandbytes' NF4 values (agent/quant/nf4.cc holds the same table for the LibTorch path).
__constant__ float kNf4[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

constexpr int kThreads = 256;
constexpr int kAbsmaxBlock = 256;

using memplan::cuda::FromFloat;

// The block's absmax; _rn intrinsics keep nvcc from contracting the product and sum into an FMA,
// which would round once where bitsandbytes rounds twice.
__device__ float Absmax(const uint8_t* code, const float* scale, const float* map, float offset,
                        int64_t block) {
  return __fadd_rn(__fmul_rn(map[code[block]], scale[block / kAbsmaxBlock]), offset);
}

// One thread per 8 elements (4 data bytes, one 32-bit load; 8 outputs, one or two vector
// stores). Preconditions (checked by the launcher): numel % 8 == 0, blocksize % 8 == 0, data
// 4-byte and out 16-byte aligned.
template <typename T>
__global__ void DequantVec8(const uint32_t* __restrict__ data, const uint8_t* __restrict__ code,
                            const float* __restrict__ scale, const float* __restrict__ map,
                            float offset, int64_t groups, int64_t blocksize, T* __restrict__ out) {
  // Both tables in shared memory: lanes index them with different codes, which the constant
  // cache would serialise.
  __shared__ float smap[256];
  __shared__ float snf4[16];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) smap[i] = map[i];
  if (threadIdx.x < 16) snf4[threadIdx.x] = kNf4[threadIdx.x];
  __syncthreads();
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t w = data[g];
    const float am = Absmax(code, scale, smap, offset, g * 8 / blocksize);
    alignas(16) T v[8];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (w >> (8 * b)) & 0xFFu;
      v[2 * b] = FromFloat<T>(__fmul_rn(snf4[byte >> 4], am));
      v[2 * b + 1] = FromFloat<T>(__fmul_rn(snf4[byte & 0xFu], am));
    }
    uint4* dst = reinterpret_cast<uint4*>(out + g * 8);
    const uint4* src = reinterpret_cast<const uint4*>(v);
#pragma unroll
    for (int k = 0; k < static_cast<int>(sizeof(T) * 8 / sizeof(uint4)); ++k) dst[k] = src[k];
  }
}

// Any size and alignment: one thread per element.
template <typename T>
__global__ void DequantScalar(const uint8_t* __restrict__ data, const uint8_t* __restrict__ code,
                              const float* __restrict__ scale, const float* __restrict__ map,
                              float offset, int64_t numel, int64_t blocksize,
                              T* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t byte = data[i / 2];
    const uint8_t c = (i % 2 == 0) ? (byte >> 4) : (byte & 0xF);
    out[i] = FromFloat<T>(__fmul_rn(kNf4[c], Absmax(code, scale, map, offset, i / blocksize)));
  }
}

int64_t GridFor(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16;
}

template <typename T>
cudaError_t Launch(const uint8_t* data, const uint8_t* code, const float* scale, const float* map,
                   float offset, int64_t numel, int64_t blocksize, T* out, cudaStream_t stream) {
  const bool vec = numel % 8 == 0 && blocksize % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(data) % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    const int64_t groups = numel / 8;
    DequantVec8<T><<<GridFor(groups), kThreads, 0, stream>>>(
        reinterpret_cast<const uint32_t*>(data), code, scale, map, offset, groups, blocksize, out);
  } else {
    DequantScalar<T><<<GridFor(numel), kThreads, 0, stream>>>(data, code, scale, map, offset,
                                                               numel, blocksize, out);
  }
  return cudaGetLastError();
}

}  // namespace

int LaunchNf4Dequant(const uint8_t* data, const uint8_t* absmax_code, const float* absmax_scale,
                     const float* dynamic_map, float absmax_offset, int64_t numel,
                     int64_t blocksize, void* out, Nf4OutType out_type, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (out_type) {
    case Nf4OutType::kFloat32:
      return Launch(data, absmax_code, absmax_scale, dynamic_map, absmax_offset, numel, blocksize,
                    static_cast<float*>(out), s);
    case Nf4OutType::kBFloat16:
      return Launch(data, absmax_code, absmax_scale, dynamic_map, absmax_offset, numel, blocksize,
                    static_cast<__nv_bfloat16*>(out), s);
    case Nf4OutType::kFloat16:
      return Launch(data, absmax_code, absmax_scale, dynamic_map, absmax_offset, numel, blocksize,
                    static_cast<__half*>(out), s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace memplan::quant
