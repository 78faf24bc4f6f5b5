#include "agent/chunks/adamw8bit_kernel.h"
#include "agent/chunks/stochastic_rounding.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "agent/core/cuda_convert.cuh"

namespace memplan::chunks_cuda {
namespace {

constexpr int kBlock = 256;  // kQuantBlockElems (common/optimizer_bytes.h): one CUDA block each

using memplan::cuda::FromFloat;
using memplan::cuda::ToFloat;

// Number of midpoints strictly below x: torch::bucketize(x, mids, right=false), the code whose
// map value is nearest (ties to the lower code).
__device__ int Code(const float* mids, float x) {
  int lo = 0, hi = 255;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (mids[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__device__ float BlockMax(float x, float* scratch) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kBlock / 32; ++w) r = fmaxf(r, scratch[w]);
  __syncthreads();  // scratch is reused by the next call
  return r;
}

// The block's new absmax and this element's code: x * (1 / absmax) clamped to [-1, 1], an
// all-zero block scaling to 0 (the LibTorch path's order of operations).
__device__ void Quantize(float x, bool valid, const float* mids, float* scratch, uint8_t* code,
                         float* absmax) {
  const float amax = BlockMax(valid ? fabsf(x) : 0.f, scratch);
  const float inv = amax > 0.f ? __frcp_rn(amax) : 0.f;
  const float normed = fminf(fmaxf(__fmul_rn(x, inv), -1.f), 1.f);
  if (valid) *code = static_cast<uint8_t>(Code(mids, normed));
  if (threadIdx.x == 0) *absmax = amax;
}

// One CUDA block per 256-element quantization block, one thread per element. The _rn
// intrinsics keep nvcc from contracting products and sums into FMAs: every step rounds as the
// LibTorch path's separate tensor ops do.
template <typename T>
__global__ void __launch_bounds__(kBlock) AdamW8bit(AdamW8bitKernelArgs a) {
  __shared__ float map1[256], map2[256], mids1[255], mids2[255], scratch[kBlock / 32];
  const int t = threadIdx.x;
  map1[t] = a.signed_map[t];
  map2[t] = a.unsigned_map[t];
  __syncthreads();
  if (t < 255) {
    mids1[t] = __fmul_rn(__fadd_rn(map1[t], map1[t + 1]), 0.5f);
    mids2[t] = __fmul_rn(__fadd_rn(map2[t], map2[t + 1]), 0.5f);
  }
  __syncthreads();
  const int64_t block = blockIdx.x;
  const int64_t i = block * kBlock + t;
  const bool valid = i < a.numel;
  float* absmax1 = a.exp_avg_absmax + block * a.absmax_stride;
  float* absmax2 = a.exp_avg_sq_absmax + block * a.absmax_stride;
  float m = 0.f, v = 0.f;
  if (valid) {
    float g = ToFloat(static_cast<const T*>(a.grad)[i]);
    // clip_grad_norm_ scales the grad in its own dtype.
    if (a.clip_coef != nullptr) g = ToFloat(FromFloat<T>(__fmul_rn(g, *a.clip_coef)));
    m = __fmul_rn(map1[a.exp_avg_codes[i]], *absmax1);
    v = __fmul_rn(map2[a.exp_avg_sq_codes[i]], *absmax2);
    m = __fadd_rn(__fmul_rn(m, a.beta1), __fmul_rn(a.one_minus_beta1, g));
    v = __fadd_rn(__fmul_rn(v, a.beta2), __fmul_rn(__fmul_rn(a.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bias_correction2_sqrt), a.eps);
    T* param = static_cast<T*>(a.param);
    float p = ToFloat(param[i]);
    if (a.decay != 1.f) p = __fmul_rn(p, a.decay);
    p = __fadd_rn(p, __fmul_rn(a.step_size, __fdiv_rn(m, denom)));
    if constexpr (sizeof(T) == 2) {
      if (a.stochastic_rounding) {
        __nv_bfloat16_raw raw;
        raw.x = Bf16BitsStochastic(__float_as_uint(p), a.rounding_key,
                                   static_cast<uint64_t>(a.rounding_first + i));
        param[i] = raw;
      } else {
        param[i] = FromFloat<T>(p);
      }
    } else {
      param[i] = FromFloat<T>(p);
    }
  }
  // Every thread reads its block's absmax before thread 0 overwrites it in Quantize (the
  // barrier inside BlockMax orders them).
  Quantize(m, valid, mids1, scratch, a.exp_avg_codes + i, absmax1);
  Quantize(v, valid, mids2, scratch, a.exp_avg_sq_codes + i, absmax2);
}

}  // namespace

int LaunchAdamW8bitUpdate(const AdamW8bitKernelArgs& args, void* stream) {
  if (args.numel <= 0) return 0;
  const int64_t blocks = (args.numel + kBlock - 1) / kBlock;
  auto s = static_cast<cudaStream_t>(stream);
  if (args.param_bf16) {
    AdamW8bit<__nv_bfloat16><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(args);
  } else {
    AdamW8bit<float><<<static_cast<unsigned>(blocks), kBlock, 0, s>>>(args);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace memplan::chunks_cuda
