// [Soft-capped attention tiles] (agent/model/softcap_attention.h): tiles of a few queries, full
// and sliding, grouped-query heads, capped or not, against a dense eager reference (every score of
// [seq, seq], repeated kv heads, the mask added after the cap) computed by plain autograd: output
// and the gradients of q, k and v, in fp32 and bf16.
#include "agent/model/softcap_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

namespace memplan {
namespace {

const bool kSingleThread = [] {
  torch::set_num_threads(1);
  return true;
}();

torch::Tensor DenseReference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             int64_t window, double scale, double cap) {
  const int64_t groups = q.size(1) / k.size(1);
  const torch::Tensor kr = k.repeat_interleave(groups, 1);
  const torch::Tensor vr = v.repeat_interleave(groups, 1);
  const int64_t seq = q.size(2);
  const torch::Tensor i = torch::arange(seq).unsqueeze(1);
  const torch::Tensor j = torch::arange(seq).unsqueeze(0);
  torch::Tensor seen = j <= i;
  if (window > 0) seen = seen.logical_and(i - j < window);
  torch::Tensor s = torch::matmul(q, kr.transpose(-2, -1)) * scale;
  if (cap > 0) s = torch::tanh(s / cap) * cap;
  s = s.masked_fill(seen.logical_not(), -INFINITY);
  return torch::matmul(torch::softmax(s, -1, torch::kFloat32).to(q.scalar_type()), vr);
}

double RelErr(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(torch::kFloat32) - want.to(torch::kFloat32)).abs().max().item<double>() /
         (scale > 0 ? scale : 1.0);
}

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
  const torch::Tensor want = DenseReference(q32, k32, v32, window, scale, cap);
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
