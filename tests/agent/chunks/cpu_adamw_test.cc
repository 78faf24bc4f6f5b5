// The CPU AdamW kernel against torch::optim::AdamW, element for element (torch::equal).
#include "agent/chunks/cpu_adamw.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "agent/chunks/torch_sqrt.h"
#include "agent/core/torch_pch.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

struct Case {
  AdamWOptions options;
  float clip_coef;  // 1 = no clipping
};

class CpuAdamWTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuAdamWTest, MatchesTorchAdamWBitForBit) {
  const Case c = GetParam();
  torch::manual_seed(1234);
  // Sizes cover scalar tails, whole vectors and tensors large enough for torch to split the
  // work across threads.
  const std::vector<int64_t> sizes = {1, 7, 64, 1000, 100003};
  std::vector<torch::Tensor> ref_params;
  std::vector<torch::Tensor> params, exp_avgs, exp_avg_sqs;
  for (int64_t n : sizes) {
    torch::Tensor init = torch::randn({n});
    ref_params.push_back(init.clone().requires_grad_(true));
    params.push_back(init.clone());
    exp_avgs.push_back(torch::zeros({n}));
    exp_avg_sqs.push_back(torch::zeros({n}));
  }
  torch::optim::AdamW reference(ref_params, torch::optim::AdamWOptions(c.options.lr)
                                                .betas({c.options.beta1, c.options.beta2})
                                                .eps(c.options.eps)
                                                .weight_decay(c.options.weight_decay));
  for (int64_t step = 1; step <= 6; ++step) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      torch::Tensor grad = torch::randn({sizes[i]}) * (step % 2 ? 0.01 : 3.0);
      ref_params[i].mutable_grad() = grad.clone();
      if (c.clip_coef != 1.0f) {
        ref_params[i].mutable_grad().mul_(torch::full({}, c.clip_coef));
      }
      const AdamWStepScalars s = MakeAdamWStepScalars(c.options, step);
      AdamWUpdate(s, c.clip_coef, sizes[i], params[i].data_ptr<float>(), grad.data_ptr<float>(),
                  exp_avgs[i].data_ptr<float>(), exp_avg_sqs[i].data_ptr<float>(), &TorchSqrt);
    }
    reference.step();
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE(torch::equal(params[i], ref_params[i].detach()))
          << "step " << step << " size " << sizes[i] << " max diff "
          << (params[i] - ref_params[i].detach()).abs().max().item<float>();
      auto& state = static_cast<torch::optim::AdamWParamState&>(
          *reference.state().at(ref_params[i].unsafeGetTensorImpl()));
      ASSERT_TRUE(torch::equal(exp_avgs[i], state.exp_avg())) << "step " << step;
      ASSERT_TRUE(torch::equal(exp_avg_sqs[i], state.exp_avg_sq())) << "step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Options, CpuAdamWTest,
                         ::testing::Values(Case{AdamWOptions{}, 1.0f},
                                           Case{AdamWOptions{3e-4, 0.9, 0.95, 1e-8, 0.1}, 1.0f},
                                           Case{AdamWOptions{1e-2, 0.8, 0.99, 1e-6, 0.0}, 1.0f},
                                           Case{AdamWOptions{1e-3, 0.9, 0.999, 1e-8, 0.01},
                                                0.37f}));

TEST(CpuAdamWKernelsTest, TorchSqrtRunsTorchsKernel) {
  torch::manual_seed(2);
  // Wide dynamic range, denormals, zeros, infinities.
  torch::Tensor x =
      torch::cat({torch::rand({kSqrtBlockElems - 8}) * 1e-3,
                  torch::tensor({0.0f, 1e-40f, 1e-45f, 3e38f, INFINITY, 1.0f, 2.0f, 1e-12f})});
  torch::Tensor expected = x.sqrt();
  torch::Tensor out = torch::empty_like(x);
  TorchSqrt(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  EXPECT_TRUE(torch::equal(out, expected)) << "mkl path: " << TorchSqrtUsesMkl();
  out.zero_();
  TorchSqrtViaDispatcher(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
  EXPECT_TRUE(torch::equal(out, expected));
}

TEST(CpuAdamWKernelsTest, AccumulateMatchesAutogradAddition) {
  torch::manual_seed(5);
  torch::Tensor a = torch::randn({1003});
  torch::Tensor b = torch::randn({1003});
  torch::Tensor acc = torch::empty({1003});
  AccumulateGrad(/*first=*/true, 1003, a.data_ptr<float>(), acc.data_ptr<float>());
  EXPECT_TRUE(torch::equal(acc, a));
  AccumulateGrad(/*first=*/false, 1003, b.data_ptr<float>(), acc.data_ptr<float>());
  EXPECT_TRUE(torch::equal(acc, a.clone().add_(b)));

  torch::Tensor a16 = a.to(torch::kBFloat16);
  torch::Tensor b16 = b.to(torch::kBFloat16);
  AccumulateGradBf16(true, 1003, reinterpret_cast<const uint16_t*>(a16.data_ptr()),
                     acc.data_ptr<float>());
  EXPECT_TRUE(torch::equal(acc, a16.to(torch::kFloat32)));
  AccumulateGradBf16(false, 1003, reinterpret_cast<const uint16_t*>(b16.data_ptr()),
                     acc.data_ptr<float>());
  EXPECT_TRUE(torch::equal(acc, a16.to(torch::kFloat32) + b16.to(torch::kFloat32)));
}

TEST(CpuAdamWKernelsTest, RoundToBf16MatchesTorchConversion) {
  torch::manual_seed(9);
  torch::Tensor x = torch::cat(
      {torch::randn({5000}) * 1e3, torch::randn({5000}) * 1e-30,
       torch::tensor({0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3.4e38f, 1.00390625f, 1.01171875f})});
  torch::Tensor out = torch::empty(x.sizes(), torch::kBFloat16);
  RoundToBf16(x.numel(), x.data_ptr<float>(), reinterpret_cast<uint16_t*>(out.data_ptr()));
  torch::Tensor expected = x.to(torch::kBFloat16);
  // NaN != NaN: compare the bit patterns of non-NaN values and NaN-ness separately.
  torch::Tensor nan = torch::isnan(x);
  EXPECT_TRUE(torch::equal(torch::isnan(out), nan));
  EXPECT_TRUE(torch::equal(out.masked_select(~nan).view(torch::kInt16),
                           expected.masked_select(~nan).view(torch::kInt16)));
}

}  // namespace
}  // namespace memplan

namespace memplan {
namespace {

// The SGD kernel against torch::optim::SGD (no momentum), clip coefficient applied as torch's
// clip_grad_norm_ does (grad.mul_(coef)) before the step.
TEST(CpuSgdTest, MatchesTorchSgdBitForBit) {
  for (double weight_decay : {0.0, 0.05}) {
    for (float clip_coef : {1.0f, 0.37f}) {
      torch::manual_seed(99);
      const std::vector<int64_t> sizes = {1, 7, 64, 1000, 100003};
      std::vector<torch::Tensor> ref_params, params;
      for (int64_t n : sizes) {
        torch::Tensor init = torch::randn({n});
        ref_params.push_back(init.clone().requires_grad_(true));
        params.push_back(init.clone());
      }
      const double lr = 3e-2;
      torch::optim::SGD reference(ref_params,
                                  torch::optim::SGDOptions(lr).weight_decay(weight_decay));
      const SgdStepScalars s = MakeSgdStepScalars(lr, weight_decay);
      for (int step = 1; step <= 3; ++step) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          torch::Tensor grad = torch::randn({sizes[i]}) * (step % 2 ? 0.01 : 3.0);
          ref_params[i].mutable_grad() = grad.clone();
          if (clip_coef != 1.0f) ref_params[i].mutable_grad().mul_(torch::full({}, clip_coef));
          SgdUpdate(s, clip_coef, sizes[i], params[i].data_ptr<float>(), grad.data_ptr<float>());
        }
        reference.step();
        for (size_t i = 0; i < sizes.size(); ++i) {
          ASSERT_TRUE(torch::equal(params[i], ref_params[i].detach()))
              << "wd " << weight_decay << " coef " << clip_coef << " step " << step << " size "
              << sizes[i];
        }
      }
    }
  }
}

// bf16 gradient accumulation: every sum rounded to bf16, as torch adds bf16 tensors.
TEST(CpuAccumulateTest, Bf16RoundedSumMatchesTorchBf16Add) {
  torch::manual_seed(7);
  const int64_t n = 100003;
  const torch::Tensor a = torch::randn({n}).to(torch::kBFloat16);
  const torch::Tensor b = (torch::randn({n}) * 1e-3).to(torch::kBFloat16);
  torch::Tensor accum = torch::empty({n}, torch::kBFloat16);
  AccumulateGradBf16Rounded(true, n, reinterpret_cast<const uint16_t*>(a.data_ptr()),
                            reinterpret_cast<uint16_t*>(accum.data_ptr()));
  ASSERT_TRUE(torch::equal(accum, a));
  AccumulateGradBf16Rounded(false, n, reinterpret_cast<const uint16_t*>(b.data_ptr()),
                            reinterpret_cast<uint16_t*>(accum.data_ptr()));
  EXPECT_TRUE(torch::equal(accum, a + b));
  EXPECT_FALSE(torch::equal(accum, a)) << "the sum should change some elements";
}

// adamw_bf16's CPU kernel against torch's at::_fused_adamw_ on bf16 tensors (after
// clip_grad_norm_'s bf16 grad.mul_), element for element, lengths torch splits into vectors and a
// scalar tail.
TEST(CpuAdamWBf16Test, MatchesTorchFusedAdamWBitForBit) {
  if (TorchBf16VectorElems() == 0) {
    GTEST_SKIP() << "torch's CPU dispatch is neither AVX2 nor AVX-512";
  }
  torch::manual_seed(4321);
  AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  for (const float clip : {1.0f, 0.375f}) {
    for (const int64_t n : {1, 7, 31, 64, 1000, 100003}) {
      const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16);
      torch::Tensor p = torch::randn({n}).to(torch::kBFloat16);
      torch::Tensor m = torch::zeros({n}, bf16), v = torch::zeros({n}, bf16);
      torch::Tensor mine_p = p.clone(), mine_m = m.clone(), mine_v = v.clone();
      for (int64_t step = 1; step <= 5; ++step) {
        const torch::Tensor g = (torch::randn({n}) * (step % 2 ? 0.01 : 3.0)).to(torch::kBFloat16);
        torch::Tensor ref_g = g.clone();
        if (clip != 1.0f) ref_g.mul_(static_cast<double>(clip));
        at::_fused_adamw_({p}, {ref_g}, {m}, {v}, {},
                          {torch::full({}, static_cast<double>(step), torch::kFloat32)}, o.lr,
                          o.beta1, o.beta2, o.weight_decay, o.eps, false, false);
        AdamWBf16Update(MakeAdamWStepScalars(o, step), clip, n,
                        reinterpret_cast<uint16_t*>(mine_p.data_ptr()),
                        reinterpret_cast<const uint16_t*>(g.data_ptr()),
                        reinterpret_cast<uint16_t*>(mine_m.data_ptr()),
                        reinterpret_cast<uint16_t*>(mine_v.data_ptr()), TorchBf16VectorElems());
        ASSERT_TRUE(torch::equal(mine_p, p)) << "n " << n << " step " << step << " clip " << clip;
        ASSERT_TRUE(torch::equal(mine_m, m)) << "n " << n << " step " << step;
        ASSERT_TRUE(torch::equal(mine_v, v)) << "n " << n << " step " << step;
      }
    }
  }
}

// AdamWBf16ParamPass: the full update's parameters bit for bit (vector body and scalar tail, with
// and without a clip coefficient); the moments are read, not written.
TEST(CpuAdamWBf16Test, ParamPassGivesTheUpdatesParametersAndLeavesTheMoments) {
  torch::manual_seed(99);
  AdamWOptions o;
  o.lr = 2e-3;
  o.weight_decay = 0.1;
  const int64_t vector_elems = TorchBf16VectorElems() > 0 ? TorchBf16VectorElems() : 16;
  for (const float clip : {1.0f, 0.5f}) {
    const int64_t n = 1000 * vector_elems + 7;
    torch::Tensor p = torch::randn({n}).to(torch::kBFloat16);
    torch::Tensor m = (torch::randn({n}) * 0.01).to(torch::kBFloat16);
    torch::Tensor v = (torch::rand({n}) * 1e-4).to(torch::kBFloat16);
    const torch::Tensor g = (torch::randn({n}) * 0.1).to(torch::kBFloat16);
    torch::Tensor full_p = p.clone(), full_m = m.clone(), full_v = v.clone();
    torch::Tensor pass_p = p.clone(), pass_m = m.clone(), pass_v = v.clone();
    auto bits = [](torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
    const auto* grad = reinterpret_cast<const uint16_t*>(g.data_ptr());
    AdamWBf16Update(MakeAdamWStepScalars(o, 3), clip, n, bits(full_p), grad, bits(full_m),
                    bits(full_v), vector_elems);
    AdamWBf16ParamPass(MakeAdamWStepScalars(o, 3), clip, n, bits(pass_p), grad, bits(pass_m),
                       bits(pass_v), vector_elems);
    EXPECT_TRUE(torch::equal(pass_p, full_p)) << "clip " << clip;
    EXPECT_FALSE(torch::equal(pass_p, p)) << "the update should change the parameters";
    EXPECT_TRUE(torch::equal(pass_m, m));
    EXPECT_TRUE(torch::equal(pass_v, v));
    EXPECT_FALSE(torch::equal(full_m, m)) << "the full update should change the moments";
  }
}

// [Bit-exact variants]: each instruction set's elementwise kernels give the portable ones' bits on
// random data with NaN, infinities, denormals and zeros, at a length no vector width divides.
TEST(CpuIsaVariantsTest, ElementwiseKernelsMatchPortable) {
  torch::manual_seed(77);
  const int64_t n = 4099;
  torch::Tensor base = torch::randn({6, n});
  base.index_put_({0, torch::indexing::Slice(0, 5)},
                  torch::tensor({NAN, INFINITY, -INFINITY, 1e-41f, -0.0f}));
  base.index_put_({1, torch::indexing::Slice(0, 3)}, torch::tensor({0.0f, 1e-40f, NAN}));
  const torch::Tensor bf = base.to(torch::kBFloat16);
  const float* f = base.data_ptr<float>();
  const uint16_t* h = reinterpret_cast<const uint16_t*>(bf.data_ptr());
  const AdamWStepScalars s = MakeAdamWStepScalars(AdamWOptions{}, 4);
  const SgdStepScalars sgd = MakeSgdStepScalars(0.01, 0.1);
  struct Out {
    std::vector<float> p, m, v, sp, acc, acc16;
    std::vector<uint16_t> q, qm, qv, r, rs, accr;
  };
  auto run = [&](CpuIsa isa) {
    const CpuKernels& k = KernelsFor(isa);
    Out o;
    o.p.assign(f, f + n);
    o.m.assign(f + n, f + 2 * n);
    o.v.assign(n, 0.0f);
    for (int64_t i = 0; i < n; ++i) o.v[i] = std::fabs(f[2 * n + i]);
    k.adamw(s, 0.5f, n, o.p.data(), f + 3 * n, o.m.data(), o.v.data(), &TorchSqrt);
    o.sp.assign(f, f + n);
    k.sgd(sgd, 0.5f, n, o.sp.data(), f + 3 * n);
    o.acc.assign(f + 4 * n, f + 5 * n);
    k.accumulate(false, n, f, o.acc.data());
    o.acc16.assign(f + 4 * n, f + 5 * n);
    k.accumulate_bf16(false, n, h, o.acc16.data());
    o.accr.assign(h + n, h + 2 * n);
    k.accumulate_bf16_rounded(false, n, h + 2 * n, o.accr.data());
    o.q.assign(h, h + n);
    o.qm.assign(h + n, h + 2 * n);
    o.qv.assign(n, 0);
    for (int64_t i = 0; i < n; ++i) o.qv[i] = h[2 * n + i] & 0x7FFF;
    k.adamw_bf16(s, 0.5f, n, o.q.data(), h + 3 * n, o.qm.data(), o.qv.data(), 16);
    o.r.assign(n, 0);
    k.round_to_bf16(n, f, o.r.data());
    o.rs.assign(n, 0);
    k.round_to_bf16_rounding(MakeParamRounding(true, 3, 1, 2, 17), n, f, o.rs.data());
    return o;
  };
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const Out want = run(CpuIsa::kPortable);
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!CpuIsaSupported(isa)) continue;
    const Out got = run(isa);
    EXPECT_TRUE(same(got.p, want.p) && same(got.m, want.m) && same(got.v, want.v))
        << CpuIsaName(isa) << " adamw";
    EXPECT_TRUE(same(got.sp, want.sp)) << CpuIsaName(isa) << " sgd";
    EXPECT_TRUE(same(got.acc, want.acc) && same(got.acc16, want.acc16)) << CpuIsaName(isa);
    EXPECT_EQ(got.accr, want.accr) << CpuIsaName(isa);
    EXPECT_TRUE(got.q == want.q && got.qm == want.qm && got.qv == want.qv)
        << CpuIsaName(isa) << " adamw_bf16";
    EXPECT_EQ(got.r, want.r) << CpuIsaName(isa);
    EXPECT_EQ(got.rs, want.rs) << CpuIsaName(isa);
  }
}

}  // namespace
}  // namespace memplan
