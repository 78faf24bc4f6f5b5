#include "agent/dist/widened_sum_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "agent/core/cuda_convert.cuh"

namespace memplan::dist_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;  // four 16-bit inputs (8 bytes) and four fp32 outputs (16 bytes) a step

using memplan::cuda::Aligned16;
using memplan::cuda::GridBlocks;
using memplan::cuda::Pack;
using memplan::cuda::ToFloat;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    WidenedSum(const T* __restrict__ in, int world, int64_t k, float* __restrict__ out) {
  const int64_t packs = k / V;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Pack<float, V> acc;
    const Pack<T, V> first = reinterpret_cast<const Pack<T, V>*>(in)[i];
#pragma unroll
    for (int j = 0; j < V; ++j) acc.v[j] = ToFloat(first.v[j]);
    for (int r = 1; r < world; ++r) {
      const Pack<T, V> next = reinterpret_cast<const Pack<T, V>*>(in + r * k)[i];
#pragma unroll
      for (int j = 0; j < V; ++j) acc.v[j] = acc.v[j] + ToFloat(next.v[j]);
    }
    reinterpret_cast<Pack<float, V>*>(out)[i] = acc;
  }
}

template <typename T>
int Launch(const void* in, int world, int64_t k, float* out, cudaStream_t s) {
  const auto* p = static_cast<const T*>(in);
  // Every slice starts on an aligned pack when k is a multiple of the pack and `in` is aligned.
  if (k % kVec == 0 && Aligned16(in) && Aligned16(out)) {
    WidenedSum<T, kVec><<<GridBlocks(k / kVec, kThreads), kThreads, 0, s>>>(p, world, k, out);
  } else {
    WidenedSum<T, 1><<<GridBlocks(k, kThreads), kThreads, 0, s>>>(p, world, k, out);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchWidenedSum(const void* in, int world, int64_t k, KernelDtype dtype, float* out,
                     void* stream) {
  if (k <= 0 || world <= 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return memplan::cuda::DispatchDtype(
      dtype, [&](auto tag) { return Launch<decltype(tag)>(in, world, k, out, s); });
}

}  // namespace memplan::dist_cuda
