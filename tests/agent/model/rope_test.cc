// [Fused RoPE] (agent/model/rope.h) against the decoder's eager expression, q.transpose(1, 2) * cos
// + SwapHalves(q.transpose(1, 2)) * sin: values and gradients bit for bit, on the CPU (the eager
// ops) and on CUDA (rope_kernel.cu; the GPU tests skip without a GPU).
#include "agent/model/rope.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "agent/model/layers.h"

namespace memplan {
namespace {

struct Result {
  torch::Tensor out, dx;
};

// cos and sin tables [table_batch, seq, head_dim] as LlamaModel::MakeRope builds them: fp32 angles,
// both halves of cos, sin with its first half negated, rounded to `dtype`. Each batch row of a
// per-row table has its own positions (M-RoPE).
void Tables(int64_t table_batch, int64_t seq, int64_t head_dim, torch::ScalarType dtype,
            torch::Device device, torch::Tensor* cos, torch::Tensor* sin) {
  const int64_t half = head_dim / 2;
  const torch::Tensor inv_freq =
      1.0 / torch::pow(10000.0, torch::arange(0, head_dim, 2, torch::kFloat32) / head_dim);
  const torch::Tensor positions =
      torch::arange(seq, torch::kFloat32).unsqueeze(0) +
      3 * torch::arange(table_batch, torch::kFloat32).unsqueeze(1);  // [table_batch, seq]
  const torch::Tensor freqs = positions.unsqueeze(-1) * inv_freq.view({1, 1, half});
  *cos = torch::cat({freqs, freqs}, -1).cos().to(dtype).to(device);
  const torch::Tensor half_sin = freqs.sin();
  *sin = torch::cat({-half_sin, half_sin}, -1).to(dtype).to(device);
}

torch::Tensor Draw(const std::vector<int64_t>& sizes, torch::ScalarType dtype,
                   torch::Device device) {
  return (torch::randn(sizes, torch::kFloat64) * 2.0).to(dtype).to(device);
}

// The decoder's expression (llama_model.cc, LlamaModel::Block) on x [B, S, H, D]: transposed to
// [B, H, S, D], the tables broadcast as [S, D] (one table) or [B, 1, S, D] (one per row); the
// result transposed back.
Result Eager(const torch::Tensor& x0, const torch::Tensor& cos, const torch::Tensor& sin,
             const torch::Tensor& up) {
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  const bool one = cos.size(0) == 1;
  const torch::Tensor c = one ? cos[0] : cos.unsqueeze(1);
  const torch::Tensor s = one ? sin[0] : sin.unsqueeze(1);
  const torch::Tensor q = x.transpose(1, 2);
  const torch::Tensor out = (q * c + SwapHalves(q) * s).transpose(1, 2);
  out.backward(up);
  return {out.detach(), x.grad()};
}

Result Fused(const torch::Tensor& x0, const torch::Tensor& cos, const torch::Tensor& sin,
             const torch::Tensor& up) {
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  const torch::Tensor out = ApplyRope(x, cos, sin);
  out.backward(up);
  return {out.detach(), x.grad()};
}

double ExactShare(const torch::Tensor& a, const torch::Tensor& b) {
  return a.eq(b).to(torch::kFloat64).mean().item<double>();
}

// ---- CPU: the Function against the eager graph ----

TEST(RopeTest, CpuValuesAndGradientsAreTheEagerOpsBitForBit) {
  torch::manual_seed(11);
  const int64_t batch = 3, seq = 7, heads = 4;
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (int64_t head_dim : {int64_t{64}, int64_t{6}}) {
      for (int64_t table_batch : {int64_t{1}, batch}) {
        SCOPED_TRACE(testing::Message() << c10::toString(dtype) << " head_dim " << head_dim
                                        << " table_batch " << table_batch);
        torch::Tensor cos, sin;
        Tables(table_batch, seq, head_dim, dtype, torch::kCPU, &cos, &sin);
        const torch::Tensor x = Draw({batch, seq, heads, head_dim}, dtype, torch::kCPU);
        const torch::Tensor up = Draw({batch, seq, heads, head_dim}, dtype, torch::kCPU);
        const Result want = Eager(x, cos, sin, up);
        const Result got = Fused(x, cos, sin, up);
        EXPECT_TRUE(got.out.is_contiguous());
        EXPECT_EQ(got.out.sizes(), x.sizes());
        EXPECT_TRUE(torch::equal(got.out, want.out));
        EXPECT_TRUE(torch::equal(got.dx, want.dx));
      }
    }
  }
}

TEST(RopeTest, TakesTheDecodersTableShapesAndANonContiguousInput) {
  torch::manual_seed(12);
  const int64_t batch = 2, seq = 5, heads = 3, head_dim = 16;
  for (int64_t table_batch : {int64_t{1}, batch}) {
    torch::Tensor cos, sin;
    Tables(table_batch, seq, head_dim, torch::kBFloat16, torch::kCPU, &cos, &sin);
    // MakeRope's shapes: [seq, head_dim] for one table, [batch, 1, seq, head_dim] for M-RoPE.
    const torch::Tensor dcos = table_batch == 1 ? cos[0] : cos.unsqueeze(1);
    const torch::Tensor dsin = table_batch == 1 ? sin[0] : sin.unsqueeze(1);
    // x in the [B, H, S, D] storage order, viewed as [B, S, H, D].
    const torch::Tensor x =
        Draw({batch, heads, seq, head_dim}, torch::kBFloat16, torch::kCPU).transpose(1, 2);
    ASSERT_FALSE(x.is_contiguous());
    const torch::Tensor up = Draw({batch, seq, heads, head_dim}, torch::kBFloat16, torch::kCPU);
    const Result want = Eager(x, cos, sin, up);
    const Result got = Fused(x, dcos, dsin, up);
    EXPECT_TRUE(torch::equal(got.out, want.out)) << "table_batch " << table_batch;
    EXPECT_TRUE(torch::equal(got.dx, want.dx)) << "table_batch " << table_batch;
  }
}

TEST(RopeTest, RefusesBadInputsNamingThem) {
  const int64_t batch = 2, seq = 5, heads = 3, head_dim = 8;
  torch::Tensor cos, sin;
  Tables(1, seq, head_dim, torch::kFloat32, torch::kCPU, &cos, &sin);
  const torch::Tensor x = torch::randn({batch, seq, heads, head_dim});
  auto refuses = [](const std::function<void()>& call, const std::string& words) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected a refusal naming '" << words << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(words), std::string::npos)
          << e.what_without_backtrace();
    }
  };
  refuses([&] { ApplyRope(x.flatten(2), cos, sin); }, "x must be [batch, seq, heads, head_dim]");
  refuses([&] { ApplyRope(x.narrow(3, 0, 7), cos.narrow(2, 0, 7), sin.narrow(2, 0, 7)); },
          "head_dim must be even");
  refuses([&] { ApplyRope(x, cos, sin[0]); }, "differ in shape");
  refuses([&] { ApplyRope(x, cos.to(torch::kBFloat16), sin); }, "must have x's dtype");
  refuses(
      [&] {
        ApplyRope(x, cos.expand({3, seq, head_dim}), sin.expand({3, seq, head_dim}));
      },
      "must be 1 or x's batch");
  refuses([&] { ApplyRope(x.narrow(1, 0, 4), cos, sin); }, "must be x's");
  refuses(
      [&] {
        ApplyRope(x, cos.view({1, 1, 1, seq, head_dim}), sin.view({1, 1, 1, seq, head_dim}));
      },
      "cos must be [seq, head_dim]");
  refuses(
      [&] {
        ApplyRope(x, cos.view({1, seq, 2, 4}), sin.view({1, seq, 2, 4}));
      },
      "must be [table_batch, 1, seq, head_dim]");
  const torch::Tensor trained = cos.clone().requires_grad_(true);
  refuses([&] { ApplyRope(x, trained, sin); }, "must not require grad");
}

// ---- CUDA: rope_kernel.cu against the eager ops on the same GPU ----

struct GpuCase {
  int64_t batch, seq, heads, head_dim;
  bool misaligned;  // x one element past a 16-byte boundary: the scalar path at any head_dim
};

TEST(RopeTest, CudaKernelsAreTheEagerOpsBitForBit) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(13);
  const torch::Device dev(torch::kCUDA, 0);
  // head_dim 128 takes the 16-byte path in every dtype; 8 in fp32 only (a half of 4 floats); 6
  // and the misaligned input the scalar path. seq 257 and 40 heads give more items than one grid.
  const std::vector<GpuCase> cases = {
      {2, 257, 40, 128, false}, {3, 9, 5, 8, false}, {2, 11, 3, 6, false}, {2, 13, 4, 128, true}};
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    for (const GpuCase& k : cases) {
      for (int64_t table_batch : {int64_t{1}, k.batch}) {
        SCOPED_TRACE(testing::Message() << c10::toString(dtype) << " [" << k.batch << ", " << k.seq
                                        << ", " << k.heads << ", " << k.head_dim << "] table_batch "
                                        << table_batch << (k.misaligned ? " misaligned" : ""));
        torch::Tensor cos, sin;
        Tables(table_batch, k.seq, k.head_dim, dtype, dev, &cos, &sin);
        const std::vector<int64_t> sizes = {k.batch, k.seq, k.heads, k.head_dim};
        torch::Tensor x = Draw(sizes, dtype, dev);
        if (k.misaligned) {
          const torch::Tensor flat = torch::empty({x.numel() + 1}, x.options());
          torch::Tensor view = flat.narrow(0, 1, x.numel()).view(sizes);
          view.copy_(x);
          x = view;
          ASSERT_TRUE(x.is_contiguous());
          ASSERT_NE(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16, 0u);
        }
        const torch::Tensor up = Draw(sizes, dtype, dev);
        // Fused first on the misaligned input: Eager clones x into fresh (aligned) storage.
        const Result got = Fused(x, cos, sin, up);
        const Result want = Eager(x, cos, sin, up);
        std::printf("%-8s [%lld, %lld, %lld, %lld] table_batch %lld%s: exact %.6f fwd, %.6f bwd\n",
                    c10::toString(dtype), static_cast<long long>(k.batch),
                    static_cast<long long>(k.seq), static_cast<long long>(k.heads),
                    static_cast<long long>(k.head_dim), static_cast<long long>(table_batch),
                    k.misaligned ? " misaligned" : "", ExactShare(got.out, want.out),
                    ExactShare(got.dx, want.dx));
        EXPECT_TRUE(got.out.is_cuda());
        EXPECT_TRUE(torch::equal(got.out, want.out));
        EXPECT_TRUE(torch::equal(got.dx, want.dx));
      }
    }
  }
}

TEST(RopeTest, CudaGradientInAnotherLayoutIsMadeContiguous) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(14);
  const torch::Device dev(torch::kCUDA, 0);
  const int64_t batch = 2, seq = 33, heads = 6, head_dim = 64;
  torch::Tensor cos, sin;
  Tables(1, seq, head_dim, torch::kBFloat16, dev, &cos, &sin);
  const torch::Tensor x = Draw({batch, seq, heads, head_dim}, torch::kBFloat16, dev);
  // As in the decoder, whose attention's gradient reaches the rotation through a transpose.
  const torch::Tensor up =
      Draw({batch, heads, seq, head_dim}, torch::kBFloat16, dev).transpose(1, 2);
  const Result got = Fused(x, cos, sin, up);
  const Result want = Eager(x, cos, sin, up);
  EXPECT_TRUE(torch::equal(got.out, want.out));
  EXPECT_TRUE(torch::equal(got.dx, want.dx));
}

}  // namespace
}  // namespace memplan
