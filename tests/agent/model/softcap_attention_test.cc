// [Soft-capped attention tiles] (SoftcapAttention, agent/model/attention.h): tiles of a few
// queries, full and sliding, grouped-query heads, capped or not, against the dense eager reference
// (dense_attention.h): output and the gradients of q, k and v, in fp32 and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "agent/model/attention.h"
#include "tests/agent/model/dense_attention.h"

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

// (window, cap, tile rows, dtype)
class SoftcapAttentionTest
    : public ::testing::TestWithParam<std::tuple<int64_t, double, int64_t, torch::ScalarType>> {};

TEST_P(SoftcapAttentionTest, TilesMatchTheDenseEagerMath) {
  const auto [window, cap, rows, dtype] = GetParam();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const int64_t batch = 2, heads = 4, kv_heads = 2, seq = 23, dim = 12;
  const double scale = std::pow(20.0, -0.5);
  auto make = [&](int64_t h) {
    return (torch::randn({batch, h, seq, dim}, gen) * 1.5).to(dtype).requires_grad_(true);
  };
  const torch::Tensor q = make(heads), k = make(kv_heads), v = make(kv_heads);
  const torch::Tensor grad = torch::randn({batch, heads, seq, dim}, gen).to(dtype);

  const torch::Tensor got = SoftcapAttention(q, k, v, window, scale, cap, rows);
  const auto g = torch::autograd::grad({got}, {q, k, v}, {grad});
  // The reference in fp32 whatever the dtype under test: bf16 is judged against it.
  const torch::Tensor q32 = q.detach().to(torch::kFloat32).requires_grad_(true);
  const torch::Tensor k32 = k.detach().to(torch::kFloat32).requires_grad_(true);
  const torch::Tensor v32 = v.detach().to(torch::kFloat32).requires_grad_(true);
  const torch::Tensor want = DenseAttention(q32, k32, v32, window, scale, cap);
  const auto w = torch::autograd::grad({want}, {q32, k32, v32}, {grad.to(torch::kFloat32)});
  const double tol = dtype == torch::kFloat32 ? 2e-6 : 2e-2;
  EXPECT_LT(RelErr(got, want), tol);
  EXPECT_LT(RelErr(g[0], w[0]), tol) << "dq";
  EXPECT_LT(RelErr(g[1], w[1]), tol) << "dk";
  EXPECT_LT(RelErr(g[2], w[2]), tol) << "dv";
  EXPECT_EQ(got.scalar_type(), dtype);
  // The layout the output projection reads: [batch, seq, heads, dim] in storage.
  EXPECT_TRUE(got.transpose(1, 2).is_contiguous());
}

INSTANTIATE_TEST_SUITE_P(WindowsCapsTiles, SoftcapAttentionTest,
                         ::testing::Combine(::testing::Values(int64_t{0}, int64_t{5}, int64_t{40}),
                                            ::testing::Values(0.0, 1.5),
                                            ::testing::Values(int64_t{0}, int64_t{3}),
                                            ::testing::Values(torch::kFloat32, torch::kBFloat16)));

// A tile's recompute in backward reproduces its forward: two backward passes of the same graph
// inputs give the same gradients, and forward is deterministic.
TEST(SoftcapAttentionDeterminism, SameInputsSameResults) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const torch::Tensor q = torch::randn({1, 2, 9, 8}, gen).requires_grad_(true);
  const torch::Tensor k = torch::randn({1, 1, 9, 8}, gen).requires_grad_(true);
  const torch::Tensor v = torch::randn({1, 1, 9, 8}, gen).requires_grad_(true);
  const torch::Tensor a = SoftcapAttention(q, k, v, 4, 0.3, 2.0, 2);
  const torch::Tensor b = SoftcapAttention(q, k, v, 4, 0.3, 2.0, 2);
  EXPECT_TRUE(torch::equal(a, b));
}

}  // namespace
}  // namespace memplan
