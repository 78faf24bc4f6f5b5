// [Sharded persistent state] A 16-bit model's reduced grad shard, one pass on the GPU: the rank
// sum's mean rounded to the model dtype, and the sum of its squares in fp64 for the clipping
// norm. The eager ops it replaces (chunk_optimizer.cc, OnStateShardReduced) run four kernels over
// the shard and write an fp64 copy of it. The rounded mean is theirs bit for bit: the sum times
// the fp32 reciprocal of the rank count, as ATen's CUDA division by a scalar computes it, then
// rounded to nearest-even. The squares are summed in a fixed order of blocks, not ATen's, so
// the fp64 total may differ in its last bits. CUDA-free interface; built only when the project
// found a CUDA compiler (MEMPLAN_SHARD_MEAN_CUDA).
#pragma once

#include <cstdint>

#include "agent/core/kernel_dtype.h"

namespace memplan::chunks_cuda {

using cuda::KernelDtype;

// How many fp64 partial sums LaunchShardMean writes for a shard of n elements.
int64_t ShardMeanPartials(int64_t n);

// mean[i] = round_to_dtype(sum[i] * (1.0f / world)) for n contiguous elements (mean: kBFloat16 or
// kFloat16), and partials[b] = the sum over block b's elements of double(mean[i])², for the
// ShardMeanPartials(n) blocks. Launches on `stream` (a cudaStream_t); returns the cudaError_t of
// the launch (0 = success).
int LaunchShardMean(const float* sum, int64_t n, int world, KernelDtype dtype, void* mean,
                    double* partials, void* stream);

}  // namespace memplan::chunks_cuda
