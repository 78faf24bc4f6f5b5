#include "agent/model/rms_norm_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <initializer_list>

#include "agent/core/cuda_convert.cuh"

namespace memplan::model_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;  // four 16-bit elements (8 bytes) or four fp32 ones (16 bytes) a step

using memplan::cuda::Aligned16;
using memplan::cuda::DispatchDtype;
using memplan::cuda::FromFloat;
using memplan::cuda::GridBlocks;
using memplan::cuda::Pack;
using memplan::cuda::ToFloat;

// The eager ops' arithmetic: each product and sum in fp32 rounded on its own (the _rn intrinsics
// keep nvcc from contracting them into FMAs), a 16-bit result rounded to nearest-even.
template <typename T>
__device__ T MulRound(float a, float b) {
  return FromFloat<T>(__fmul_rn(a, b));
}

// Every op reads and writes pack i: elements [i·V, i·V + V) of one row (the width is a multiple
// of V whenever V > 1).
template <typename T>
struct Squares {
  const T* x;
  float* sq;
  template <int V>
  __device__ void Apply(int64_t i) const {
    const Pack<T, V> a = reinterpret_cast<const Pack<T, V>*>(x)[i];
    Pack<float, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = __fmul_rn(ToFloat(a.v[k]), ToFloat(a.v[k]));
    reinterpret_cast<Pack<float, V>*>(sq)[i] = o;
  }
};

// out = round(other · round(float(x) · rstd[row])): forward with the weight as `other` (one value
// per column), and the weight's gradient product with the upstream gradient (one per element).
template <typename T>
struct NormTimes {
  const T* x;
  const T* other;
  bool other_per_column;
  const float* rstd;
  int64_t width;
  T* out;
  template <int V>
  __device__ void Apply(int64_t i) const {
    const int64_t at = i * V;
    const float r = rstd[at / width];
    const Pack<T, V> a = reinterpret_cast<const Pack<T, V>*>(x)[i];
    const Pack<T, V> b = other_per_column
                             ? reinterpret_cast<const Pack<T, V>*>(other + at % width)[0]
                             : reinterpret_cast<const Pack<T, V>*>(other)[i];
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const T n = MulRound<T>(ToFloat(a.v[k]), r);
      o.v[k] = MulRound<T>(ToFloat(b.v[k]), ToFloat(n));
    }
    reinterpret_cast<Pack<T, V>*>(out)[i] = o;
  }
};

template <typename T>
struct GradProduct {
  const T* g;
  const T* w;
  const T* x;
  int64_t width;
  float* prod;
  template <int V>
  __device__ void Apply(int64_t i) const {
    const int64_t at = i * V;
    const Pack<T, V> dg = reinterpret_cast<const Pack<T, V>*>(g)[i];
    const Pack<T, V> b = reinterpret_cast<const Pack<T, V>*>(w + at % width)[0];
    const Pack<T, V> a = reinterpret_cast<const Pack<T, V>*>(x)[i];
    Pack<float, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gn = ToFloat(MulRound<T>(ToFloat(dg.v[k]), ToFloat(b.v[k])));
      o.v[k] = __fmul_rn(gn, ToFloat(a.v[k]));
    }
    reinterpret_cast<Pack<float, V>*>(prod)[i] = o;
  }
};

template <typename T>
struct GradInput {
  const T* g;
  const T* w;
  const T* x;
  const float* rstd;
  const float* gsq;
  int64_t width;
  T* gx;
  template <int V>
  __device__ void Apply(int64_t i) const {
    const int64_t at = i * V;
    const int64_t row = at / width;
    const float r = rstd[row];
    const float s = gsq[row];
    const Pack<T, V> dg = reinterpret_cast<const Pack<T, V>*>(g)[i];
    const Pack<T, V> b = reinterpret_cast<const Pack<T, V>*>(w + at % width)[0];
    const Pack<T, V> a = reinterpret_cast<const Pack<T, V>*>(x)[i];
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gn = ToFloat(MulRound<T>(ToFloat(dg.v[k]), ToFloat(b.v[k])));
      const float by_rstd = __fmul_rn(gn, r);
      const float by_pow = __fmul_rn(s, __fmul_rn(ToFloat(a.v[k]), 2.0f));
      o.v[k] = FromFloat<T>(__fadd_rn(by_rstd, by_pow));
    }
    reinterpret_cast<Pack<T, V>*>(gx)[i] = o;
  }
};

template <int V, typename Op>
__global__ void __launch_bounds__(kThreads) EachPack(Op op, int64_t packs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    op.template Apply<V>(i);
  }
}

// Packs of kVec where the width allows them and every pointer is 16-byte aligned (the weight's
// packs then start aligned in every row), single elements otherwise.
template <typename Op>
int Launch(const Op& op, int64_t n, int64_t width, bool aligned, cudaStream_t s) {
  if (n <= 0) return 0;
  if (width % kVec == 0 && aligned) {
    EachPack<kVec><<<GridBlocks(n / kVec, kThreads), kThreads, 0, s>>>(op, n / kVec);
  } else {
    EachPack<1><<<GridBlocks(n, kThreads), kThreads, 0, s>>>(op, n);
  }
  return static_cast<int>(cudaGetLastError());
}

bool AllAligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (!Aligned16(p)) return false;
  }
  return true;
}

}  // namespace

int LaunchRmsNormSquares(const void* x, int64_t n, KernelDtype dtype, float* sq, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return Launch(Squares<T>{static_cast<const T*>(x), sq}, n, n, AllAligned({x, sq}), s);
  }, /*sixteen_bit_only=*/true);
}

int LaunchRmsNormForward(const void* x, const void* w, const float* rstd, int64_t rows,
                         int64_t width, KernelDtype dtype, void* y, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const NormTimes<T> op{static_cast<const T*>(x), static_cast<const T*>(w), true, rstd, width,
                          static_cast<T*>(y)};
    return Launch(op, rows * width, width, AllAligned({x, w, y}), s);
  }, /*sixteen_bit_only=*/true);
}

int LaunchRmsNormGradProduct(const void* g, const void* w, const void* x, int64_t rows,
                             int64_t width, KernelDtype dtype, float* prod, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const GradProduct<T> op{static_cast<const T*>(g), static_cast<const T*>(w),
                            static_cast<const T*>(x), width, prod};
    return Launch(op, rows * width, width, AllAligned({g, w, x, prod}), s);
  }, /*sixteen_bit_only=*/true);
}

int LaunchRmsNormGradInput(const void* g, const void* w, const void* x, const float* rstd,
                           const float* gsq, int64_t rows, int64_t width, KernelDtype dtype,
                           void* gx, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const GradInput<T> op{static_cast<const T*>(g), static_cast<const T*>(w),
                          static_cast<const T*>(x), rstd, gsq, width, static_cast<T*>(gx)};
    return Launch(op, rows * width, width, AllAligned({g, w, x, gx}), s);
  }, /*sixteen_bit_only=*/true);
}

int LaunchRmsNormWeightGradProduct(const void* g, const void* x, const float* rstd, int64_t rows,
                                   int64_t width, KernelDtype dtype, void* gwp, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return DispatchDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const NormTimes<T> op{static_cast<const T*>(x), static_cast<const T*>(g), false, rstd, width,
                          static_cast<T*>(gwp)};
    return Launch(op, rows * width, width, AllAligned({g, x, gwp}), s);
  }, /*sixteen_bit_only=*/true);
}

}  // namespace memplan::model_cuda
