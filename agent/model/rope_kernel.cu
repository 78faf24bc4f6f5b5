#include "agent/model/rope_kernel.h"

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

// a * b + c * d as the eager mul, mul and add kernels compute it: each op in fp32 and its result
// rounded to T. The _rn intrinsics keep nvcc from contracting a product and the sum into an FMA,
// which would round once where the eager ops round twice.
template <typename T>
__device__ T DotRounded(T a, T b, T c, T d) {
  const T p = FromFloat<T>(__fmul_rn(ToFloat(a), ToFloat(b)));
  const T q = FromFloat<T>(__fmul_rn(ToFloat(c), ToFloat(d)));
  return FromFloat<T>(__fadd_rn(ToFloat(p), ToFloat(q)));
}


// One item is kVec elements at offset c of the first half of one (batch, seq, head) row and the
// kVec elements half a row further, which are each other's partners under SwapHalves. Forward
// (kBackward false): out1 = x1 cos1 + x2 sin1, out2 = x2 cos2 + x1 sin2. Backward, the adjoint:
// dx1 = g1 cos1 + g2 sin2, dx2 = g2 cos2 + g1 sin1.
template <typename T, int kVec, bool kBackward>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(const T* __restrict__ in, const T* __restrict__ cos, const T* __restrict__ sin,
               T* __restrict__ out, int64_t items, int64_t chunks, int64_t seq, int64_t heads,
               int64_t head_dim, bool per_batch_table) {
  using P = Pack<T, kVec>;
  const int64_t half = head_dim / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / chunks;
    const int64_t col = (i - row * chunks) * kVec;
    const int64_t token = row / heads;  // batch * seq + position
    const int64_t table_row = per_batch_table ? token : token % seq;
    const int64_t at = row * head_dim + col;
    const int64_t tat = table_row * head_dim + col;
    const P x1 = *reinterpret_cast<const P*>(in + at);
    const P x2 = *reinterpret_cast<const P*>(in + at + half);
    const P c1 = *reinterpret_cast<const P*>(cos + tat);
    const P c2 = *reinterpret_cast<const P*>(cos + tat + half);
    const P s1 = *reinterpret_cast<const P*>(sin + tat);
    const P s2 = *reinterpret_cast<const P*>(sin + tat + half);
    P o1, o2;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (kBackward) {
        o1.v[k] = DotRounded(x1.v[k], c1.v[k], x2.v[k], s2.v[k]);
        o2.v[k] = DotRounded(x2.v[k], c2.v[k], x1.v[k], s1.v[k]);
      } else {
        o1.v[k] = DotRounded(x1.v[k], c1.v[k], x2.v[k], s1.v[k]);
        o2.v[k] = DotRounded(x2.v[k], c2.v[k], x1.v[k], s2.v[k]);
      }
    }
    *reinterpret_cast<P*>(out + at) = o1;
    *reinterpret_cast<P*>(out + at + half) = o2;
  }
}

unsigned Blocks(int64_t items) { return memplan::cuda::GridBlocks(items, kThreads); }

template <typename T, bool kBackward>
int Launch(const void* in, const void* cos, const void* sin, void* out, const RopeShape& shape,
           cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const auto* ip = static_cast<const T*>(in);
  const auto* cp = static_cast<const T*>(cos);
  const auto* sp = static_cast<const T*>(sin);
  auto* op = static_cast<T*>(out);
  const int64_t half = shape.head_dim / 2;
  const int64_t rows = shape.batch * shape.seq * shape.heads;
  const bool per_batch = shape.table_batch != 1;
  // A half row that is a multiple of kVec keeps every row's halves 16-byte aligned once the base
  // pointers are.
  if (half % kVec == 0 && Aligned16(in) && Aligned16(cos) && Aligned16(sin) && Aligned16(out)) {
    const int64_t chunks = half / kVec;
    const int64_t items = rows * chunks;
    RopeKernel<T, kVec, kBackward><<<Blocks(items), kThreads, 0, stream>>>(
        ip, cp, sp, op, items, chunks, shape.seq, shape.heads, shape.head_dim, per_batch);
  } else {
    const int64_t items = rows * half;
    RopeKernel<T, 1, kBackward><<<Blocks(items), kThreads, 0, stream>>>(
        ip, cp, sp, op, items, half, shape.seq, shape.heads, shape.head_dim, per_batch);
  }
  return static_cast<int>(cudaGetLastError());
}

template <bool kBackward>
int Dispatch(const void* in, const void* cos, const void* sin, void* out, const RopeShape& shape,
             KernelDtype dtype, void* stream) {
  if (shape.head_dim % 2 != 0 || shape.head_dim < 0 ||
      (shape.table_batch != 1 && shape.table_batch != shape.batch)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (shape.batch * shape.seq * shape.heads * shape.head_dim <= 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  return memplan::cuda::DispatchDtype(dtype, [&](auto tag) {
    return Launch<decltype(tag), kBackward>(in, cos, sin, out, shape, s);
  });
}

}  // namespace

int LaunchRopeForward(const void* x, const void* cos, const void* sin, void* out,
                      const RopeShape& shape, KernelDtype dtype, void* stream) {
  return Dispatch<false>(x, cos, sin, out, shape, dtype, stream);
}

int LaunchRopeBackward(const void* grad, const void* cos, const void* sin, void* grad_x,
                       const RopeShape& shape, KernelDtype dtype, void* stream) {
  return Dispatch<true>(grad, cos, sin, grad_x, shape, dtype, stream);
}

}  // namespace memplan::model_cuda
