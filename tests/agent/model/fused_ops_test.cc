// [Fused norm] and [Fused gate] (agent/model/layers.h) against the eager ops they replace: their
// values and gradients bit for bit; on CUDA the gate's kernel within one rounding of the dtype of
// the eager ops (bit for bit on an H200; the GPU tests skip without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "agent/model/layers.h"

namespace memplan {
namespace {

struct Grads {
  torch::Tensor out, dx, dw;
};

// Runs `fn(x, w)` forward and backward with a fixed upstream gradient.
template <typename Fn>
Grads ForwardBackward(Fn fn, const torch::Tensor& x0, const torch::Tensor& w0,
                      const torch::Tensor& up, bool w_trains = true) {
  torch::Tensor x = x0.detach().clone().requires_grad_(true);
  torch::Tensor w = w0.detach().clone().requires_grad_(w_trains);
  torch::Tensor out = fn(x, w);
  out.backward(up);
  return {out.detach(), x.grad(), w_trains ? w.grad() : torch::Tensor()};
}

// max |a - b| / max |b|, in fp32.
double RelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor a32 = a.to(torch::kFloat32).cpu();
  const torch::Tensor b32 = b.to(torch::kFloat32).cpu();
  return (a32 - b32).abs().max().item<double>() /
         std::max(b32.abs().max().item<double>(), 1e-30);
}

// True when every element of `a` is within one unit in the last place of `b`'s dtype of `b`
// (relative to |b|, with a floor at the dtype's smallest normal).
bool WithinOneRounding(const torch::Tensor& a, const torch::Tensor& b) {
  double eps = 0, tiny = 0;
  switch (b.scalar_type()) {
    case torch::kBFloat16:
      eps = std::ldexp(1.0, -7), tiny = 1e-38;
      break;
    case torch::kHalf:
      eps = std::ldexp(1.0, -10), tiny = 6.2e-5;
      break;
    default:
      eps = std::ldexp(1.0, -23), tiny = 1e-38;
  }
  const torch::Tensor a64 = a.to(torch::kFloat64).cpu();
  const torch::Tensor b64 = b.to(torch::kFloat64).cpu();
  const torch::Tensor bound = b64.abs().clamp_min(tiny) * eps;
  return ((a64 - b64).abs() <= bound).all().item<bool>();
}

double ExactShare(const torch::Tensor& a, const torch::Tensor& b) {
  return a.eq(b).to(torch::kFloat64).mean().item<double>();
}

torch::Tensor Draw(std::vector<int64_t> sizes, torch::ScalarType dtype, torch::Device device,
                   double scale = 1.0) {
  return (torch::randn(sizes, torch::kFloat64) * scale).to(dtype).to(device);
}

auto Fused = [](const torch::Tensor& x, const torch::Tensor& w) { return RmsNorm(x, w, 1e-5); };
auto Eager = [](const torch::Tensor& x, const torch::Tensor& w) {
  return RmsNormUnfused(x, w, 1e-5);
};

// ---- CPU: the Function against the eager graph ----

// (An fp32 input takes the eager graph itself: layers.cc, RmsNorm.)
TEST(FusedNormTest, CpuIsTheEagerGraphBitForBit) {
  torch::manual_seed(5);
  for (torch::ScalarType dtype : {torch::kBFloat16, torch::kHalf}) {
    const torch::Tensor x = Draw({3, 7, 96}, dtype, torch::kCPU, 3.0);
    const torch::Tensor w = Draw({96}, dtype, torch::kCPU);
    const torch::Tensor up = Draw({3, 7, 96}, dtype, torch::kCPU);
    const Grads a = ForwardBackward(Fused, x, w, up);
    const Grads b = ForwardBackward(Eager, x, w, up);
    // The eager graph's values and gradients bit for bit.
    EXPECT_TRUE(torch::equal(a.out, b.out)) << dtype;
    EXPECT_TRUE(torch::equal(a.dx, b.dx)) << dtype;
    EXPECT_TRUE(torch::equal(a.dw, b.dw)) << dtype;
    EXPECT_EQ(a.dx.scalar_type(), dtype);
    EXPECT_EQ(a.dw.scalar_type(), dtype);
  }
}

TEST(FusedNormTest, FrozenWeightGetsNoGradientAndTheInputItsOwn) {
  torch::manual_seed(6);
  const torch::Tensor x = Draw({2, 5, 32}, torch::kBFloat16, torch::kCPU);
  const torch::Tensor w = Draw({32}, torch::kBFloat16, torch::kCPU);
  const torch::Tensor up = Draw({2, 5, 32}, torch::kBFloat16, torch::kCPU);
  const Grads a = ForwardBackward(Fused, x, w, up, /*w_trains=*/false);
  const Grads b = ForwardBackward(Eager, x, w, up, /*w_trains=*/false);
  EXPECT_TRUE(torch::equal(a.dx, b.dx));
  EXPECT_FALSE(a.dw.defined());
}

auto Gate = [](const torch::Tensor& g, const torch::Tensor& u) { return GatedProduct(g, u); };
auto EagerGate = [](const torch::Tensor& g, const torch::Tensor& u) { return torch::silu(g) * u; };
auto GeluGate = [](const torch::Tensor& g, const torch::Tensor& u) {
  return GatedProduct(g, u, GateActivation::kGeluTanh);
};
auto EagerGeluGate = [](const torch::Tensor& g, const torch::Tensor& u) {
  return at::gelu(g, "tanh") * u;
};

TEST(FusedGateTest, CpuIsTheEagerOpsBitForBit) {
  torch::manual_seed(7);
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    const torch::Tensor g = Draw({4, 9, 40}, dtype, torch::kCPU, 4.0);
    const torch::Tensor u = Draw({4, 9, 40}, dtype, torch::kCPU);
    const torch::Tensor up = Draw({4, 9, 40}, dtype, torch::kCPU);
    for (bool gelu : {false, true}) {
      const Grads a = gelu ? ForwardBackward(GeluGate, g, u, up) : ForwardBackward(Gate, g, u, up);
      const Grads b =
          gelu ? ForwardBackward(EagerGeluGate, g, u, up) : ForwardBackward(EagerGate, g, u, up);
      EXPECT_TRUE(torch::equal(a.out, b.out)) << dtype << " gelu " << gelu;
      EXPECT_TRUE(torch::equal(a.dx, b.dx)) << dtype << " gelu " << gelu;  // d/dg
      EXPECT_TRUE(torch::equal(a.dw, b.dw)) << dtype << " gelu " << gelu;  // d/du
    }
  }
}

// ---- CUDA: the fused kernels against the eager ops on the same GPU ----

class FusedCudaTest : public ::testing::TestWithParam<torch::ScalarType> {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(FusedCudaTest, GateKernelRoundsAsTheEagerOps) {
  const torch::ScalarType dtype = GetParam();
  torch::manual_seed(8);
  // 4 x 1000 x 1536 takes the 16-byte path; 3 x 5 x 37 (not a multiple of 8) the scalar one.
  for (std::vector<int64_t> sizes : {std::vector<int64_t>{4, 1000, 1536}, {3, 5, 37}}) {
    const torch::Tensor g = Draw(sizes, dtype, torch::kCUDA, 4.0);
    const torch::Tensor u = Draw(sizes, dtype, torch::kCUDA);
    const torch::Tensor up = Draw(sizes, dtype, torch::kCUDA);
    const Grads a = ForwardBackward(Gate, g, u, up);
    const Grads b = ForwardBackward(EagerGate, g, u, up);
    std::printf("%s %lld elements: exact out %.6f, d/dg %.6f, d/du %.6f\n",
                std::string(c10::toString(dtype)).c_str(), static_cast<long long>(g.numel()),
                ExactShare(a.out, b.out), ExactShare(a.dx, b.dx), ExactShare(a.dw, b.dw));
    EXPECT_TRUE(WithinOneRounding(a.out, b.out));
    EXPECT_TRUE(WithinOneRounding(a.dx, b.dx));
    EXPECT_TRUE(WithinOneRounding(a.dw, b.dw));
  }
}

// A 16-bit norm runs rms_norm_kernel.cu's passes on the GPU (the vector path for a width that is a
// multiple of 4 and aligned tensors, single elements otherwise: a width of 1022, an upstream
// gradient that starts one element into its storage), fp32 the eager graph; both bit for bit.
TEST_P(FusedCudaTest, NormIsTheEagerNormOnTheGpu) {
  const torch::ScalarType dtype = GetParam();
  torch::manual_seed(9);
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 512, 2048}, {2, 64, 8, 128}, {3, 5, 1022}, {7, 96}};
  for (const std::vector<int64_t>& shape : shapes) {
    for (bool misaligned : {false, true}) {
      const int64_t width = shape.back();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      const torch::Tensor flat = Draw({n + 1}, dtype, torch::kCUDA, 2.0);
      const torch::Tensor x = flat.narrow(0, misaligned ? 1 : 0, n).view(shape);
      const torch::Tensor w = Draw({width}, dtype, torch::kCUDA);
      // (ForwardBackward clones x, so the upstream gradient is what starts misaligned.)
      const torch::Tensor up_flat = Draw({n + 1}, dtype, torch::kCUDA);
      const torch::Tensor up = up_flat.narrow(0, misaligned ? 1 : 0, n).view(shape);
      const Grads a = ForwardBackward(Fused, x, w, up);
      const Grads b = ForwardBackward(Eager, x, w, up);
      std::printf("%s %s%s: exact out %.4f, dx %.4f, dw %.4f; rel dx %.3g, dw %.3g\n",
                  std::string(c10::toString(dtype)).c_str(),
                  c10::str(c10::IntArrayRef(shape)).c_str(), misaligned ? " misaligned" : "",
                  ExactShare(a.out, b.out), ExactShare(a.dx, b.dx), ExactShare(a.dw, b.dw),
                  RelDiff(a.dx, b.dx), RelDiff(a.dw, b.dw));
      // The eager graph's values and gradients bit for bit on the GPU too.
      EXPECT_TRUE(torch::equal(a.out, b.out)) << c10::IntArrayRef(shape);
      EXPECT_TRUE(torch::equal(a.dx, b.dx)) << c10::IntArrayRef(shape);
      EXPECT_TRUE(torch::equal(a.dw, b.dw)) << c10::IntArrayRef(shape);
      // A frozen weight (LoRA, the vision tower's norms): the input's gradient alone.
      const Grads c = ForwardBackward(Fused, x, w, up, /*w_trains=*/false);
      EXPECT_TRUE(torch::equal(c.dx, b.dx)) << c10::IntArrayRef(shape);
      EXPECT_FALSE(c.dw.defined());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedCudaTest,
                         ::testing::Values(torch::kFloat32, torch::kBFloat16, torch::kHalf));

}  // namespace
}  // namespace memplan
