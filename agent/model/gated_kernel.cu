#include "agent/model/gated_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "agent/core/cuda_convert.cuh"

namespace memplan::model_cuda {
namespace {

constexpr int kThreads = 256;

using memplan::cuda::Aligned16;
using memplan::cuda::FromFloat;
using memplan::cuda::Pack;
using memplan::cuda::ToFloat;

// The eager kernels' formulas (ATen's silu and silu_backward on CUDA compute in fp32 for 16-bit
// tensors with expf), each result rounded to T where the eager op writes a T tensor.
template <typename T>
__device__ T Silu(T g) {
  const float x = ToFloat(g);
  return FromFloat<T>(x / (1.0f + expf(-x)));
}

template <typename T>
__device__ T SiluBackward(T dy, T g) {
  const float d = ToFloat(dy);
  const float x = ToFloat(g);
  const float s = 1.0f / (1.0f + expf(-x));
  return FromFloat<T>(d * s * (1.0f + x * (1.0f - s)));
}

template <typename T>
__device__ T Mul(T a, T b) {
  return FromFloat<T>(ToFloat(a) * ToFloat(b));
}


template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    SiluGateForward(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ out,
                    int64_t packs) {
  using P = Pack<T, kVec>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const P a = reinterpret_cast<const P*>(g)[i];
    const P b = reinterpret_cast<const P*>(u)[i];
    P o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) o.v[k] = Mul(Silu(a.v[k]), b.v[k]);
    reinterpret_cast<P*>(out)[i] = o;
  }
}

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    SiluGateBackward(const T* __restrict__ grad, const T* __restrict__ g, const T* __restrict__ u,
                     T* __restrict__ grad_g, T* __restrict__ grad_u, int64_t packs) {
  using P = Pack<T, kVec>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const P dy = reinterpret_cast<const P*>(grad)[i];
    const P a = reinterpret_cast<const P*>(g)[i];
    const P b = reinterpret_cast<const P*>(u)[i];
    P dg, du;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      du.v[k] = Mul(dy.v[k], Silu(a.v[k]));
      dg.v[k] = SiluBackward(Mul(dy.v[k], b.v[k]), a.v[k]);
    }
    reinterpret_cast<P*>(grad_g)[i] = dg;
    reinterpret_cast<P*>(grad_u)[i] = du;
  }
}

unsigned Blocks(int64_t items) { return memplan::cuda::GridBlocks(items, kThreads); }

template <typename T>
int Forward(const void* g, const void* u, void* out, int64_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const auto* gp = static_cast<const T*>(g);
  const auto* up = static_cast<const T*>(u);
  auto* op = static_cast<T*>(out);
  if (n % kVec == 0 && Aligned16(g) && Aligned16(u) && Aligned16(out)) {
    SiluGateForward<T, kVec><<<Blocks(n / kVec), kThreads, 0, s>>>(gp, up, op, n / kVec);
  } else {
    SiluGateForward<T, 1><<<Blocks(n), kThreads, 0, s>>>(gp, up, op, n);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int Backward(const void* grad, const void* g, const void* u, void* grad_g, void* grad_u,
             int64_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const auto* dp = static_cast<const T*>(grad);
  const auto* gp = static_cast<const T*>(g);
  const auto* up = static_cast<const T*>(u);
  auto* dgp = static_cast<T*>(grad_g);
  auto* dup = static_cast<T*>(grad_u);
  if (n % kVec == 0 && Aligned16(grad) && Aligned16(g) && Aligned16(u) && Aligned16(grad_g) &&
      Aligned16(grad_u)) {
    SiluGateBackward<T, kVec><<<Blocks(n / kVec), kThreads, 0, s>>>(dp, gp, up, dgp, dup, n / kVec);
  } else {
    SiluGateBackward<T, 1><<<Blocks(n), kThreads, 0, s>>>(dp, gp, up, dgp, dup, n);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchSiluGateForward(const void* g, const void* u, void* out, int64_t n, KernelDtype dtype,
                          void* stream) {
  if (n <= 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return memplan::cuda::DispatchDtype(
      dtype, [&](auto tag) { return Forward<decltype(tag)>(g, u, out, n, s); });
}

int LaunchSiluGateBackward(const void* grad, const void* g, const void* u, void* grad_g,
                           void* grad_u, int64_t n, KernelDtype dtype, void* stream) {
  if (n <= 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return memplan::cuda::DispatchDtype(dtype, [&](auto tag) {
    return Backward<decltype(tag)>(grad, g, u, grad_g, grad_u, n, s);
  });
}

}  // namespace memplan::model_cuda
