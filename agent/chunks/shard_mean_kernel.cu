#include "agent/chunks/shard_mean_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "agent/core/cuda_convert.cuh"

namespace memplan::chunks_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // partial sums per shard (a grid-stride loop covers the rest)
constexpr int kVec = 4;           // four fp32 sums (16 bytes) and four 16-bit means a step

using memplan::cuda::Aligned16;
using memplan::cuda::FromFloat;
using memplan::cuda::Pack;
using memplan::cuda::ToFloat;

int64_t Blocks(int64_t items) {
  const int64_t want = (items + kThreads - 1) / kThreads;
  return want < 1 ? 1 : (want < kMaxBlocks ? want : kMaxBlocks);
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    ShardMean(const float* __restrict__ sum, int64_t packs, float inv_world, T* __restrict__ mean,
              double* __restrict__ partials) {
  double squares = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pack<float, V> s = reinterpret_cast<const Pack<float, V>*>(sum)[i];
    Pack<T, V> m;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      m.v[j] = FromFloat<T>(s.v[j] * inv_world);
      const double d = static_cast<double>(ToFloat(m.v[j]));
      squares += d * d;
    }
    reinterpret_cast<Pack<T, V>*>(mean)[i] = m;
  }
  // The block's threads' sums, added pairwise in shared memory in a fixed order.
  __shared__ double block[kThreads];
  block[threadIdx.x] = squares;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) block[threadIdx.x] += block[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = block[0];
}

template <typename T>
int Launch(const float* sum, int64_t n, float inv_world, void* mean, double* partials,
           cudaStream_t s) {
  auto* m = static_cast<T*>(mean);
  const int64_t blocks = ShardMeanPartials(n);
  if (n % kVec == 0 && Aligned16(sum) && Aligned16(mean)) {
    ShardMean<T, kVec><<<blocks, kThreads, 0, s>>>(sum, n / kVec, inv_world, m, partials);
  } else {
    ShardMean<T, 1><<<blocks, kThreads, 0, s>>>(sum, n, inv_world, m, partials);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int64_t ShardMeanPartials(int64_t n) { return Blocks(n % kVec == 0 ? n / kVec : n); }

int LaunchShardMean(const float* sum, int64_t n, int world, KernelDtype dtype, void* mean,
                    double* partials, void* stream) {
  if (n <= 0 || world <= 0) return static_cast<int>(cudaErrorInvalidValue);
  auto s = static_cast<cudaStream_t>(stream);
  // ATen's CUDA division by a scalar multiplies by the reciprocal computed in the op's math type.
  const float inv_world = 1.0f / static_cast<float>(world);
  return memplan::cuda::DispatchDtype(
      dtype,
      [&](auto tag) { return Launch<decltype(tag)>(sum, n, inv_world, mean, partials, s); },
      /*sixteen_bit_only=*/true);
}

}  // namespace memplan::chunks_cuda
