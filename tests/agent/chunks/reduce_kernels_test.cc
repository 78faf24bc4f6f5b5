// The CUDA passes of a sharded 16-bit model's grad reduction against the eager ops they replace:
// [Narrow reduce-scatter]'s rank-order fp32 sum (agent/dist/widened_sum_kernel.h) and [Sharded
// persistent state]'s rounded mean and squares (agent/chunks/shard_mean_kernel.h). The sum and
// the mean bit for bit, the fp64 squares to 1e-12 of the total. Skipped without a GPU, or in a
// build without the CUDA kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#ifdef MEMPLAN_REDUCE_KERNELS_TEST
#include "agent/chunks/shard_mean_kernel.h"
#include "agent/core/kernel_launch.h"
#include "agent/dist/widened_sum_kernel.h"
#endif

namespace memplan {
namespace {

#ifdef MEMPLAN_REDUCE_KERNELS_TEST
bool HaveGpu() { return torch::cuda::is_available(); }

// Values over many binades, so every rounding case of the sums and the means comes up.
torch::Tensor Spread(int64_t n, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::Tensor v = torch::randn({n}, opts) * torch::exp2(torch::randint(-12, 6, {n}, opts));
  return v.to(dtype);
}

// Sizes: a vectorised one, one the vector path cannot take (odd) and a tiny one.
const std::vector<int64_t> kSizes = {4096 * 33, 1001, 4};
const std::vector<torch::ScalarType> kDtypes = {torch::kBFloat16, torch::kFloat16};
#endif

TEST(WidenedSumKernelTest, EqualsTheEagerRankOrderLoopBitForBit) {
#ifndef MEMPLAN_REDUCE_KERNELS_TEST
  GTEST_SKIP() << "built without the CUDA kernels";
#else
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  int cases = 0;
  for (torch::ScalarType dtype : kDtypes) {
    for (int world : {2, 3, 4}) {
      for (int64_t k : kSizes) {
        for (int64_t shift : {0, 1}) {  // 1: a misaligned input, the scalar path
          const torch::Tensor all = Spread(world * k + shift, dtype, 17 + world + k);
          const torch::Tensor received = all.narrow(0, shift, world * k);
          // WidenedReduce's eager loop (agent/dist/process_group.cc).
          torch::Tensor eager = received.narrow(0, 0, k).to(torch::kFloat32);
          for (int r = 1; r < world; ++r) eager.add_(received.narrow(0, r * k, k));
          torch::Tensor fused = torch::empty({k}, eager.options());
          cuda::CheckLaunch(dist_cuda::LaunchWidenedSum(received.data_ptr(), world, k,
                                                        *cuda::KernelDtypeOf(received),
                                                        fused.data_ptr<float>(),
                                                        cuda::CurrentStream(fused)),
                            "widened sum");
          EXPECT_TRUE(torch::equal(fused, eager))
              << dtype << " world " << world << " k " << k << " shift " << shift;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 3 * 3 * 2);
#endif
}

TEST(ShardMeanKernelTest, EqualsTheEagerMeanBitForBitAndItsSquares) {
#ifndef MEMPLAN_REDUCE_KERNELS_TEST
  GTEST_SKIP() << "built without the CUDA kernels";
#else
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (torch::ScalarType dtype : kDtypes) {
    for (int world : {2, 3, 5}) {
      for (int64_t n : kSizes) {
        const torch::Tensor sum = Spread(n, torch::kFloat32, 29 + world + n);
        // ChunkOptimizer::OnStateShardReduced's eager ops.
        const torch::Tensor mean = sum.clone().div_(world).to(dtype);
        const double squares = mean.to(torch::kFloat64).pow(2).sum().item<double>();
        torch::Tensor fused = torch::empty({n}, sum.options().dtype(dtype));
        torch::Tensor partials = torch::empty({chunks_cuda::ShardMeanPartials(n)},
                                              sum.options().dtype(torch::kFloat64));
        cuda::CheckLaunch(
            chunks_cuda::LaunchShardMean(sum.data_ptr<float>(), n, world,
                                         *cuda::KernelDtypeOf(fused), fused.data_ptr(),
                                         partials.data_ptr<double>(), cuda::CurrentStream(sum)),
            "shard mean");
        EXPECT_TRUE(torch::equal(fused, mean)) << dtype << " world " << world << " n " << n;
        const double got = partials.sum().item<double>();
        EXPECT_GT(squares, 0.0);
        EXPECT_NEAR(got, squares, 1e-12 * squares) << dtype << " world " << world << " n " << n;
      }
    }
  }
#endif
}

TEST(ShardMeanKernelTest, RefusesAnFp32MeanAndAnEmptyShard) {
#ifndef MEMPLAN_REDUCE_KERNELS_TEST
  GTEST_SKIP() << "built without the CUDA kernels";
#else
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::Tensor sum = torch::ones({8}, opts);
  torch::Tensor out = torch::empty({8}, opts);
  torch::Tensor partials =
      torch::empty({chunks_cuda::ShardMeanPartials(8)}, opts.dtype(torch::kFloat64));
  EXPECT_NE(chunks_cuda::LaunchShardMean(sum.data_ptr<float>(), 8, 2, cuda::KernelDtype::kFloat32,
                                         out.data_ptr(), partials.data_ptr<double>(),
                                         cuda::CurrentStream(sum)),
            0);
  EXPECT_NE(chunks_cuda::LaunchShardMean(sum.data_ptr<float>(), 0, 2, cuda::KernelDtype::kBFloat16,
                                         out.data_ptr(), partials.data_ptr<double>(),
                                         cuda::CurrentStream(sum)),
            0);
#endif
}

}  // namespace
}  // namespace memplan
