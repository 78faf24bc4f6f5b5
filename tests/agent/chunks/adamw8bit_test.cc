// 8-bit AdamW (agent/chunks/cpu_adamw.h, agent/chunks/adamw8bit_torch.h) against a reference
// written here from bitsandbytes' definitions: the dynamic maps from create_dynamic_map's
// formula, quantization by counting the midpoints below each value (all of them, no search), the
// update as torch ops on whole tensors. The CPU kernel and the LibTorch path must both give the
// reference's bits on the CPU.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "agent/chunks/adamw8bit_torch.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/torch_pch.h"
#include "common/optimizer_bytes.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

// create_dynamic_map(signed, max_exponent_bits=7, total_bits=8) in double precision: for
// exponent i = 0..6, the midpoints of linspace(0.1, 1, n_i + 1) scaled by 10^(i - 6), n_i =
// 2^i (signed, both signs) or 2^(i+1) (unsigned); plus 0 and 1; sorted.
std::vector<double> DynamicMapDefinition(bool is_signed) {
  std::vector<double> data;
  for (int i = 0; i < 7; ++i) {
    const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    for (int k = 0; k + 1 < items; ++k) {
      const double lo = 0.1 + 0.9 * k / (items - 1), hi = 0.1 + 0.9 * (k + 1) / (items - 1);
      const double v = std::pow(10.0, i - 6) * (lo + hi) / 2;
      data.push_back(v);
      if (is_signed) data.push_back(-v);
    }
  }
  data.push_back(0);
  data.push_back(1);
  std::sort(data.begin(), data.end());
  return data;
}

TEST(AdamW8bitMapsTest, FollowTheDynamicMapDefinition) {
  for (const bool is_signed : {true, false}) {
    const float* map = is_signed ? kSignedDynamicMap : kUnsignedDynamicMap;
    const std::vector<double> want = DynamicMapDefinition(is_signed);
    ASSERT_EQ(want.size(), 256u);
    // The definition to fp32 rounding (bitsandbytes computes it in fp32 steps).
    for (int i = 0; i < 256; ++i) {
      EXPECT_NEAR(map[i], want[i], 1e-7 * std::max(1.0, std::fabs(want[i]))) << i;
      if (i > 0) {
        EXPECT_LT(map[i - 1], map[i]) << "sorted, distinct entries";
      }
    }
    EXPECT_EQ(map[255], 1.0f);
  }
}

// ---------------------------------------------------------------- the reference

torch::Tensor MapTensor(bool is_signed) {
  return torch::from_blob(const_cast<float*>(is_signed ? kSignedDynamicMap : kUnsignedDynamicMap),
                          {256}, torch::kFloat32)
      .clone();
}

struct RefQuantized {
  torch::Tensor codes;   // uint8 [n]
  torch::Tensor absmax;  // fp32 [ceil(n / 256)]
};

// Block by block: absmax, the scaled values, bucketed by the midpoints of consecutive entries (a
// value on a midpoint goes to the lower code), as bitsandbytes' default backend quantizes.
RefQuantized RefQuantize(const torch::Tensor& x, const torch::Tensor& map) {
  const int64_t n = x.numel();
  RefQuantized q{torch::empty({n}, torch::kUInt8),
                 torch::empty({(n + 255) / 256}, torch::kFloat32)};
  for (int64_t b = 0; b * 256 < n; ++b) {
    const torch::Tensor xb = x.narrow(0, b * 256, std::min<int64_t>(256, n - b * 256));
    const torch::Tensor a = xb.abs().max();
    // bitsandbytes' default backend: x * (1 / max(absmax, 1e-38)), clamped to [-1, 1].
    const torch::Tensor normed = (xb * (1.0 / a.clamp_min(1e-38))).clamp(-1, 1);
    // Count midpoints strictly below each value.
    const torch::Tensor mids = (map.slice(0, 0, 255) + map.slice(0, 1, 256)) / 2;
    q.codes.narrow(0, b * 256, xb.numel())
        .copy_((mids.unsqueeze(0) < normed.unsqueeze(1)).sum(1).to(torch::kUInt8));
    q.absmax[b] = a;
  }
  return q;
}

torch::Tensor RefDequantize(const RefQuantized& q, const torch::Tensor& map) {
  const int64_t n = q.codes.numel();
  torch::Tensor out = map.index({q.codes.to(torch::kLong)});
  for (int64_t b = 0; b * 256 < n; ++b) {
    out.narrow(0, b * 256, std::min<int64_t>(256, n - b * 256)).mul_(q.absmax[b]);
  }
  return out;
}

// fp32 -> bf16 rounded stochastically, written with tensor ops from the definition: add 16 noise
// bits below bf16's cut and truncate (the noise is the header's RoundingNoise16, element index
// from 0).
torch::Tensor RefStochasticBf16(const torch::Tensor& p32, uint64_t key) {
  const int64_t n = p32.numel();
  torch::Tensor noise = torch::empty({n}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    noise[i] = static_cast<int64_t>(RoundingNoise16(key, static_cast<uint64_t>(i)));
  }
  // fp32 bits as a non-negative int64, the sum truncated to its high 16 bits.
  const torch::Tensor bits = p32.contiguous().view(torch::kInt32).to(torch::kInt64) & 0xFFFFFFFFll;
  const torch::Tensor rounded = ((bits + noise) & 0xFFFF0000ll).to(torch::kInt32);
  return rounded.view(torch::kFloat32).to(torch::kBFloat16);  // exact: low half is zero
}

// bitsandbytes' optimizer_update_8bit_blockwise ("adam", CPU) after clip_grad_norm_'s grad.mul_;
// with `stochastic_key`, a bf16 parameter is rounded stochastically instead of to nearest.
void RefStep(const AdamWOptions& o, int64_t step, float clip, torch::Tensor param,
             torch::Tensor grad, RefQuantized& m8, RefQuantized& v8,
             std::optional<uint64_t> stochastic_key = std::nullopt) {
  const torch::Tensor signed_map = MapTensor(true), unsigned_map = MapTensor(false);
  torch::Tensor g = clip != 1.0f ? grad * static_cast<double>(clip) : grad;
  g = g.to(torch::kFloat32);
  torch::Tensor m = RefDequantize(m8, signed_map);
  torch::Tensor v = RefDequantize(v8, unsigned_map);
  m.mul_(o.beta1).add_(g, 1 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  const double c1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double c2 = std::sqrt(1 - std::pow(o.beta2, static_cast<double>(step)));
  const torch::Tensor denom = (v.sqrt() / c2).add_(o.eps);
  torch::Tensor p = param.to(torch::kFloat32);
  if (o.weight_decay > 0) p.mul_(1 - o.lr * o.weight_decay);
  p.addcdiv_(m, denom, -o.lr / c1);
  if (stochastic_key.has_value() && param.scalar_type() == torch::kBFloat16) {
    param.copy_(RefStochasticBf16(p, *stochastic_key));
  } else {
    param.copy_(p);
  }
  m8 = RefQuantize(m, signed_map);
  v8 = RefQuantize(v, unsigned_map);
}

// ---------------------------------------------------------------- the cases

struct Case {
  bool bf16;
  AdamWOptions options;
  float clip;
  bool stochastic = false;  // [Stochastic rounding] of the bf16 parameter
};

// The rounding of a case's update `step` (parameter index 3, seed 5: any fixed values).
ParamRounding CaseRounding(const Case& c, int64_t step) {
  return MakeParamRounding(c.stochastic, 5, 3, step, 0);
}
std::optional<uint64_t> CaseKey(const Case& c, int64_t step) {
  if (!c.stochastic) return std::nullopt;
  return CaseRounding(c, step).key;
}

class AdamW8bitTest : public ::testing::TestWithParam<Case> {};

// Whole tensors from element 0, like bitsandbytes: several sizes, including a partial block, a
// tensor below bitsandbytes' min_8bit_size and ones above it that are not multiples of 256.
TEST_P(AdamW8bitTest, KernelAndTorchPathEqualTheReference) {
  const Case c = GetParam();
  const auto dtype = c.bf16 ? torch::kBFloat16 : torch::kFloat32;
  torch::manual_seed(7);
  for (const int64_t n : {int64_t{1}, int64_t{200}, int64_t{256}, int64_t{1000}, int64_t{4096},
                          int64_t{5000}, int64_t{70001}}) {
    const int64_t blocks = (n + 255) / 256;
    torch::Tensor init = torch::randn({n}).to(dtype);
    torch::Tensor ref = init.clone(), kernel = init.clone(), via_torch = init.clone();
    RefQuantized ref_m{torch::zeros({n}, torch::kUInt8), torch::zeros({blocks})};
    RefQuantized ref_v = ref_m;
    ref_v.codes = ref_m.codes.clone();
    ref_v.absmax = ref_m.absmax.clone();
    std::vector<torch::Tensor> k_state = {torch::zeros({n}, torch::kUInt8),
                                          torch::zeros({n}, torch::kUInt8),
                                          torch::zeros({blocks}), torch::zeros({blocks})};
    std::vector<torch::Tensor> t_state;
    for (const torch::Tensor& t : k_state) t_state.push_back(t.clone());
    const QuantMapTensors maps = MakeQuantMapTensors(torch::kCPU);
    for (int64_t step = 1; step <= 5; ++step) {
      // Mixed scales: moments whose blocks span several decades.
      torch::Tensor grad = (torch::randn({n}) * torch::exp(torch::randn({n}) * 2) *
                            (step % 2 ? 0.01 : 1.0))
                               .to(dtype);
      if (n > 300) grad.narrow(0, 256, 20).zero_();  // zero grads inside a block
      RefStep(c.options, step, c.clip, ref, grad, ref_m, ref_v, CaseKey(c, step));
      const AdamWStepScalars s = MakeAdamWStepScalars(c.options, step);
      QuantBlocks whole;  // one tensor from element 0: consecutive absmax entries
      if (c.bf16) {
        AdamW8bitUpdateBf16(s, c.clip, n, whole,
                            reinterpret_cast<uint16_t*>(kernel.data_ptr<at::BFloat16>()),
                            reinterpret_cast<const uint16_t*>(grad.data_ptr<at::BFloat16>()),
                            k_state[0].data_ptr<uint8_t>(), k_state[1].data_ptr<uint8_t>(),
                            k_state[2].data_ptr<float>(), k_state[3].data_ptr<float>(),
                            &TorchSqrt, CaseRounding(c, step));
      } else {
        AdamW8bitUpdate(s, c.clip, n, whole, kernel.data_ptr<float>(), grad.data_ptr<float>(),
                        k_state[0].data_ptr<uint8_t>(), k_state[1].data_ptr<uint8_t>(),
                        k_state[2].data_ptr<float>(), k_state[3].data_ptr<float>(), &TorchSqrt);
      }
      const torch::Tensor coef =
          c.clip != 1.0f ? torch::full({}, c.clip, torch::kFloat32) : torch::Tensor();
      AdamW8bitTorchUpdate(c.options, step, coef, maps, via_torch, grad, t_state[0], t_state[1],
                           t_state[2], t_state[3], CaseRounding(c, step));
      const std::string at = "n=" + std::to_string(n) + " step " + std::to_string(step);
      ASSERT_TRUE(torch::equal(kernel, ref))
          << at << " max diff "
          << (kernel.to(torch::kFloat32) - ref.to(torch::kFloat32)).abs().max().item<float>();
      ASSERT_TRUE(torch::equal(k_state[0], ref_m.codes)) << at;
      ASSERT_TRUE(torch::equal(k_state[1], ref_v.codes)) << at;
      ASSERT_TRUE(torch::equal(k_state[2], ref_m.absmax)) << at;
      ASSERT_TRUE(torch::equal(k_state[3], ref_v.absmax)) << at;
      ASSERT_TRUE(torch::equal(via_torch, ref)) << at;
      for (int k = 0; k < 4; ++k) ASSERT_TRUE(torch::equal(t_state[k], k_state[k])) << at << k;
    }
    // The 8-bit state tracks the fp32 moments it stands for.
    EXPECT_GT(ref_v.absmax.min().item<float>(), 0) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Options, AdamW8bitTest,
                         ::testing::Values(Case{false, AdamWOptions{}, 1.0f},
                                           Case{false, AdamWOptions{3e-3, 0.9, 0.95, 1e-8, 0.1},
                                                0.37f},
                                           Case{true, AdamWOptions{1e-2, 0.8, 0.99, 1e-6, 0.0},
                                                1.0f},
                                           Case{true, AdamWOptions{1e-3, 0.9, 0.999, 1e-8, 0.01},
                                                0.37f},
                                           Case{true, AdamWOptions{1e-3, 0.9, 0.999, 1e-8, 0.01},
                                                0.37f, true},
                                           Case{true, AdamWOptions{1e-2, 0.8, 0.99, 1e-6, 0.0},
                                                1.0f, true}));

// The fused CUDA kernel (persistent chunks on a GPU) against the reference run on the CPU, with
// absmax entries strided as the chunk manager lays them out. The kernel does each operation in
// the reference's order with fp32 rounding, but torch's CPU ops may contract a product into an
// FMA: allowed are parameters within 4 ulp (of their dtype) of the update's largest operand (a
// result near zero by cancellation was off by 1e-10 in fp32 while far below 1 ulp of the
// operands; with PyTorch 2.11 on an H200 host one fp32 element of 1 M was off by 3.18e-12 where
// 2 ulp were 3.05e-12, the same with two kernel variants: docs/benchmarks.md, "Twenty-second
// session"), absmax within 1e-6 relative, and codes off by one on at most 0.1 % of the elements
// (a value at a midpoint tie). Skips without CUDA.
TEST_P(AdamW8bitTest, FusedCudaKernelMatchesTheReference) {
  if (!torch::cuda::is_available() || !AdamW8bitFusedKernelBuilt()) {
    GTEST_SKIP() << "no CUDA device or no fused kernel in this build";
  }
  const Case c = GetParam();
  const auto dtype = c.bf16 ? torch::kBFloat16 : torch::kFloat32;
  const double ulp = c.bf16 ? 1.0 / 128 : 1.0 / (1 << 23);
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(11);
  const QuantMapTensors maps = MakeQuantMapTensors(cuda);
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{70001}, int64_t{1} << 20}) {
    const int64_t blocks = (n + 255) / 256;
    torch::Tensor ref = torch::randn({n}).to(dtype);
    torch::Tensor dev = ref.to(cuda);
    RefQuantized ref_m{torch::zeros({n}, torch::kUInt8), torch::zeros({blocks})};
    RefQuantized ref_v{torch::zeros({n}, torch::kUInt8), torch::zeros({blocks})};
    torch::Tensor m8 = torch::zeros({n}, torch::dtype(torch::kUInt8).device(cuda));
    torch::Tensor v8 = m8.clone();
    torch::Tensor slots_m = torch::zeros({2 * blocks}, torch::dtype(torch::kFloat32).device(cuda));
    torch::Tensor slots_v = slots_m.clone();
    torch::Tensor am = slots_m.slice(0, 0, 2 * blocks, 2), av = slots_v.slice(0, 0, 2 * blocks, 2);
    for (int64_t step = 1; step <= 5; ++step) {
      torch::Tensor grad = (torch::randn({n}) * torch::exp(torch::randn({n}) * 2)).to(dtype);
      const torch::Tensor before = ref.to(torch::kFloat32).clone();
      RefStep(c.options, step, c.clip, ref, grad, ref_m, ref_v, CaseKey(c, step));
      const torch::Tensor coef =
          c.clip != 1.0f ? torch::full({}, c.clip, torch::dtype(torch::kFloat32).device(cuda))
                         : torch::Tensor();
      AdamW8bitTorchUpdate(c.options, step, coef, maps, dev, grad.to(cuda), m8, v8, am, av,
                           CaseRounding(c, step));
      const std::string at = "n=" + std::to_string(n) + " step " + std::to_string(step);
      const torch::Tensor p32 = dev.cpu().to(torch::kFloat32), r32 = ref.to(torch::kFloat32);
      // 4 ulp of the largest operand of the update's last add (the decayed parameter or the
      // step): a result that cancels to near zero keeps the operands' absolute error.
      const torch::Tensor bound =
          (r32.abs() + before.abs() + (r32 - before).abs()).clamp_min(1e-30) * (4 * ulp);
      const torch::Tensor excess = (p32 - r32).abs() / bound;
      const int64_t worst = excess.argmax().item<int64_t>();
      // The worst element's inputs and results, for whoever has to diagnose a failure.
      ASSERT_TRUE((excess <= 1).all().item<bool>())
          << at << " max diff " << (p32 - r32).abs().max().item<float>() << "; worst element "
          << worst << ": before " << before[worst].item<float>() << " reference "
          << r32[worst].item<float>() << " kernel " << p32[worst].item<float>() << " bound "
          << bound[worst].item<float>() << " grad " << grad.to(torch::kFloat32)[worst].item<float>()
          << " codes after the step " << static_cast<int>(ref_m.codes[worst].item<uint8_t>())
          << " / " << static_cast<int>(ref_v.codes[worst].item<uint8_t>());
      for (const auto& [codes, want] : {std::pair{m8, ref_m.codes}, std::pair{v8, ref_v.codes}}) {
        const torch::Tensor diff = (codes.cpu().to(torch::kInt32) - want.to(torch::kInt32)).abs();
        ASSERT_LE(diff.max().item<int>(), 1) << at;
        ASSERT_LE(diff.sum().item<int64_t>(), std::max<int64_t>(1, n / 1000)) << at;
      }
      ASSERT_TRUE(torch::allclose(am.cpu(), ref_m.absmax, 1e-6, 0)) << at;
      ASSERT_TRUE(torch::allclose(av.cpu(), ref_v.absmax, 1e-6, 0)) << at;
      // Keep the two runs on the same state, so that differences do not compound.
      dev.copy_(ref);
      m8.copy_(ref_m.codes);
      v8.copy_(ref_v.codes);
      am.copy_(ref_m.absmax);
      av.copy_(ref_v.absmax);
    }
  }
}

// A range that starts inside a parameter block (a shard's first elements) and absmax slots with
// gaps, as the chunk manager lays them out: equal to updating the pieces as separate tensors.
TEST(AdamW8bitKernelTest, BlockPhaseAndSlotStrides) {
  torch::manual_seed(3);
  const AdamWOptions o{1e-2, 0.9, 0.99, 1e-8, 0.05};
  const int64_t head = 100, n = 100 + 3 * 256 + 17;  // a 100-element piece, then 4 blocks
  torch::Tensor p = torch::randn({n}), grad = torch::randn({n});
  torch::Tensor q = p.clone();
  std::vector<uint8_t> m(n, 0), v(n, 0), qm(n, 0), qv(n, 0);
  // Slots: 0 for the piece, then every 4th slot from slot 3 (fp32: 64-element slots).
  std::vector<float> ma(3 + 4 * 4, 0.0f), va(ma.size(), 0.0f);
  std::vector<float> qma(5, 0.0f), qva(5, 0.0f);
  for (int64_t step = 1; step <= 3; ++step) {
    const AdamWStepScalars s = MakeAdamWStepScalars(o, step);
    QuantBlocks blocks;
    blocks.first_block_elems = head;
    blocks.first_slot_gap = 3;
    blocks.slot_stride = 4;
    AdamW8bitUpdate(s, 1.0f, n, blocks, p.data_ptr<float>(), grad.data_ptr<float>(), m.data(),
                    v.data(), ma.data(), va.data(), &TorchSqrt);
    QuantBlocks piece{head, 1, 1}, rest{256, 1, 1};
    AdamW8bitUpdate(s, 1.0f, head, piece, q.data_ptr<float>(), grad.data_ptr<float>(),
                    qm.data(), qv.data(), qma.data(), qva.data(), &TorchSqrt);
    AdamW8bitUpdate(s, 1.0f, n - head, rest, q.data_ptr<float>() + head,
                    grad.data_ptr<float>() + head, qm.data() + head, qv.data() + head,
                    qma.data() + 1, qva.data() + 1, &TorchSqrt);
    ASSERT_TRUE(torch::equal(p, q)) << step;
    ASSERT_EQ(m, qm);
    ASSERT_EQ(v, qv);
    for (int b = 0; b < 5; ++b) {
      const int slot = b == 0 ? 0 : 3 + (b - 1) * 4;
      ASSERT_EQ(ma[slot], qma[b]) << b;
      ASSERT_EQ(va[slot], qva[b]) << b;
    }
  }
}

TEST(AdamW8bitKernelTest, QuantizeEdgeCases) {
  // The extremes code exactly; an all-zero block keeps absmax 0 and reads back zeros.
  const float x[4] = {-2.0f, 2.0f, 0.0f, 0.5f};
  uint8_t codes[4];
  EXPECT_EQ(QuantizeBlock8bit(kSignedDynamicMap, 4, x, codes), 2.0f);
  EXPECT_EQ(codes[0], 0);  // the most negative entry, -0.99297 (the map has no -1)
  EXPECT_EQ(codes[1], 255);
  EXPECT_EQ(kSignedDynamicMap[codes[2]], 0.0f);
  float back[4];
  DequantizeBlock8bit(kSignedDynamicMap, 2.0f, 4, codes, back);
  EXPECT_EQ(back[0], 2.0f * kSignedDynamicMap[0]);
  EXPECT_EQ(back[1], 2.0f);
  EXPECT_EQ(back[2], 0.0f);
  EXPECT_NEAR(back[3], 0.5f, 0.5f * 0.02f);
  const float zeros[3] = {0, 0, 0};
  EXPECT_EQ(QuantizeBlock8bit(kUnsignedDynamicMap, 3, zeros, codes), 0.0f);
  DequantizeBlock8bit(kUnsignedDynamicMap, 0.0f, 3, codes, back);
  EXPECT_EQ(back[0], 0.0f);
  // Unsigned map: zero is entry 0.
  const float sq[2] = {0.0f, 4.0f};
  QuantizeBlock8bit(kUnsignedDynamicMap, 2, sq, codes);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 255);
  // Ties go to the lower code.
  const float mid = (kSignedDynamicMap[200] + kSignedDynamicMap[201]) / 2;
  EXPECT_EQ(NearestCode8bit(kSignedDynamicMap, mid), 200);
}

uint32_t FloatBits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// Between two bf16 neighbours, the share of elements rounded up is the value's distance from the
// lower one in ulps (binomial bound of 5 sigma over 2^17 elements); nothing else comes out;
// exact bf16 values, infinities and NaN are kept; the same (key, index) rounds the same way.
TEST(StochasticRoundingTest, RoundsUpWithTheDistanceAsProbability) {
  constexpr int kN = 1 << 17;
  for (const float lower : {1.0f, -1.0f, 0.0234375f, -3.0e-8f}) {
    const uint32_t lo_bits = FloatBits(lower) & 0xFFFF0000u;  // a bf16 value
    const uint16_t lo16 = static_cast<uint16_t>(lo_bits >> 16);
    for (const double frac : {0.0, 0.03, 0.25, 0.5, 0.9}) {
      const uint32_t bits = lo_bits + static_cast<uint32_t>(frac * 65536);
      int up = 0;
      for (int i = 0; i < kN; ++i) {
        const uint16_t r = Bf16BitsStochastic(bits, /*key=*/77, static_cast<uint64_t>(i));
        ASSERT_TRUE(r == lo16 || r == lo16 + 1) << lower << " " << frac << " got " << r;
        up += r == lo16 + 1;
        ASSERT_EQ(r, Bf16BitsStochastic(bits, 77, static_cast<uint64_t>(i)));
      }
      const double sigma = std::sqrt(kN * frac * (1 - frac));
      EXPECT_NEAR(up, kN * frac, 5 * sigma + 1) << lower << " " << frac;
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(Bf16BitsStochastic(FloatBits(inf), 1, i), 0x7F80);
    EXPECT_EQ(Bf16BitsStochastic(FloatBits(-inf), 1, i), 0xFF80);
    EXPECT_EQ(Bf16BitsStochastic(0x7F800001u, 1, i), 0x7FC0);  // a NaN whose payload is low
  }
  // Other keys give other draws.
  int same = 0;
  const uint32_t half = FloatBits(1.0f) + 0x8000;
  for (int i = 0; i < 1000; ++i) {
    same += Bf16BitsStochastic(half, 1, i) == Bf16BitsStochastic(half, 2, i);
  }
  EXPECT_LT(same, 600);
  EXPECT_NE(StochasticRoundingKey(0, 1, 2), StochasticRoundingKey(0, 2, 1));
  EXPECT_NE(StochasticRoundingKey(0, 1, 2), StochasticRoundingKey(1, 1, 2));
}

// Why it exists: 1000 updates of +1e-4 on a bf16 weight of 1.0 (a bf16 ulp there is 2^-7, so
// each update is 1/78 of it). Rounded to nearest the weight never moves; rounded stochastically
// it ends near 1.1, as an fp32 master would.
TEST(StochasticRoundingTest, SmallUpdatesAddUp) {
  constexpr int kElems = 256;
  std::vector<uint16_t> nearest(kElems, 0x3F80), stochastic(kElems, 0x3F80);  // bf16 1.0
  std::vector<float> next(kElems);
  for (int step = 1; step <= 1000; ++step) {
    for (auto* w : {&nearest, &stochastic}) {
      for (int i = 0; i < kElems; ++i) next[i] = Bf16BitsToFloat((*w)[i]) + 1e-4f;
      RoundToBf16(MakeParamRounding(w == &stochastic, 3, 0, step, 0), kElems, next.data(),
                  w->data());
    }
  }
  double mean = 0;
  for (int i = 0; i < kElems; ++i) {
    EXPECT_EQ(nearest[i], 0x3F80);
    mean += Bf16BitsToFloat(stochastic[i]) / kElems;
  }
  EXPECT_NEAR(mean, 1.1, 0.005);
}

TEST(AdamW8bitBytesTest, StateBytesPerParameter) {
  // bf16: 2 code bytes + 2 x 4 absmax bytes per 128 elements (+ one slot per chunk).
  const int64_t elems = int64_t{1} << 20;
  EXPECT_EQ(QuantAbsmaxSlots(elems, 2), elems / 128 + 1);
  EXPECT_EQ(PersistentStateBytes(OptimizerKind::kAdamW8bit, 2, elems),
            2 * elems + 8 * (elems / 128 + 1));
  EXPECT_EQ(OffloadedChunkHost(OptimizerKind::kAdamW8bit, 2, 1, 2 * elems).state_bytes,
            2 * elems + 8 * (elems / 128 + 1));
  // Against fp32 AdamW with a master on the same bf16 model: 12 bytes per element.
  EXPECT_LT(PersistentStateBytes(OptimizerKind::kAdamW8bit, 2, elems),
            0.3 * PersistentStateBytes(OptimizerKind::kAdamW, 2, elems));
  EXPECT_FALSE(OptimizerKeepsMaster(OptimizerKind::kAdamW8bit, 2));
  // fp32: 64-element slots; a block may start at any of elems - 1 offsets of a shard.
  EXPECT_EQ(QuantAbsmaxSlots(1, 4), 1);
  EXPECT_EQ(QuantAbsmaxSlots(64, 4), 2);
  EXPECT_EQ(QuantAbsmaxSlots(65, 4), 2);
  EXPECT_EQ(QuantAbsmaxSlots(66, 4), 3);
}

// [Code table] / [Bit-exact variants]: every instruction set's code search against NearestCode8bit
// on a sample of all 2^32 float patterns (every 61st run of 4096 consecutive patterns, every
// float class: zeros, denormals, normals, infinities, NaNs) plus each midpoint and bucket edge and
// their neighbours. (The full 2^32 sweep of portable and AVX2 takes minutes on 2 cores.)
std::vector<float> CodeSearchSample() {
  std::vector<float> xs;
  auto add_bits = [&xs](uint32_t b) {
    float x;
    std::memcpy(&x, &b, sizeof(x));
    xs.push_back(x);
  };
  for (uint64_t base = 0; base < (uint64_t{1} << 32); base += 4096 * 61) {
    for (uint32_t i = 0; i < 4096; ++i) add_bits(static_cast<uint32_t>(base + i));
  }
  for (const float* map : {kSignedDynamicMap, kUnsignedDynamicMap}) {
    for (int i = 0; i < 255; ++i) {
      const uint32_t mid = FloatBits((map[i] + map[i + 1]) / 2);
      for (uint32_t d = 0; d <= 4; ++d) {
        add_bits(mid + d);
        add_bits(mid - d);
      }
    }
  }
  for (uint32_t k = 0; k < 512; ++k) {  // bucket edges: every binade's 2^7 steps around 2^-24..2
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t edge = sign | ((((127 - 26) << 7) + k * 8) << 16);
      add_bits(edge);
      add_bits(edge - 1);
    }
  }
  return xs;
}

TEST(AdamW8bitIsaTest, CodeSearchOfEveryVariantMatchesNearestCode) {
  const std::vector<float> xs = CodeSearchSample();
  std::vector<uint8_t> codes(xs.size());
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!CpuIsaSupported(isa)) continue;
    for (const float* map : {kSignedDynamicMap, kUnsignedDynamicMap}) {
      KernelsFor(isa).nearest_codes(map, static_cast<int64_t>(xs.size()), xs.data(),
                                    codes.data());
      int64_t bad = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        if (codes[i] != NearestCode8bit(map, xs[i]) && bad++ < 5) {
          ADD_FAILURE() << CpuIsaName(isa) << " bits " << std::hex << FloatBits(xs[i]) << " code "
                        << std::dec << int{codes[i]} << " want "
                        << int{NearestCode8bit(map, xs[i])};
        }
      }
      EXPECT_EQ(bad, 0) << CpuIsaName(isa);
    }
  }
}

// Random blocks of 1..256 elements (ties on midpoints, NaN, denormals, infinities, zero blocks):
// every variant's codes and absmax equal the scalar definition's.
TEST(AdamW8bitIsaTest, QuantizeBlockOfEveryVariantMatchesTheDefinition) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t n = 1 + trial % 256;
    const float* map = trial % 2 ? kSignedDynamicMap : kUnsignedDynamicMap;
    std::vector<float> in(n);
    const int kind = trial % 7;
    for (int64_t i = 0; i < n; ++i) {
      float x = normal(rng) * (kind == 1 ? 1e-39f : 1.0f);  // 1: denormals
      if (map == kUnsignedDynamicMap) x = std::fabs(x);
      if (kind == 2) x = 0.0f;
      if (kind == 3 && rng() % 9 == 0) x = std::numeric_limits<float>::quiet_NaN();
      if (kind == 4 && rng() % 50 == 0) x = -std::numeric_limits<float>::infinity();
      if (kind == 5) {  // exactly on midpoints of a block whose absmax is 1
        const int c = static_cast<int>(rng() % 255);
        x = (map[c] + map[c + 1]) / 2;
        if (i == 0) x = 1.0f;
      }
      in[i] = x;
    }
    float absmax = -FLT_MAX;
    for (float x : in) absmax = std::fmax(absmax, std::fabs(x));
    const float inv = absmax > 0 ? 1.0f / absmax : 0.0f;
    std::vector<uint8_t> want(n), got(n);
    for (int64_t i = 0; i < n; ++i) {
      want[i] = NearestCode8bit(map, std::clamp(in[i] * inv, -1.0f, 1.0f));
    }
    for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (!CpuIsaSupported(isa)) continue;
      const float got_absmax = KernelsFor(isa).quantize_block(map, n, in.data(), got.data());
      ASSERT_EQ(FloatBits(got_absmax), FloatBits(absmax)) << CpuIsaName(isa) << " trial " << trial;
      ASSERT_EQ(got, want) << CpuIsaName(isa) << " trial " << trial << " n " << n;
    }
  }
}

// The whole 8-bit update (fp32 and bf16 parameters, clipping, stochastic rounding, a first block
// cut short, a length no vector width divides) gives the portable variant's bits on every variant.
TEST(AdamW8bitIsaTest, UpdateOfEveryVariantMatchesPortable) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 5000 + 13;
  QuantBlocks blocks;
  blocks.first_block_elems = 100;
  blocks.first_slot_gap = 1;
  blocks.slot_stride = 2;
  const int64_t slots = 2 + 2 * (n / 256 + 1);
  for (const float clip : {1.0f, 0.37f}) {
    std::vector<float> p0(n), g0(n);
    std::vector<uint16_t> p16(n), g16(n);
    std::vector<uint8_t> m0(n), v0(n);
    std::vector<float> ma0(slots), va0(slots);
    for (int64_t i = 0; i < n; ++i) {
      p0[i] = normal(rng);
      g0[i] = normal(rng) * 1e-2f;
      p16[i] = static_cast<uint16_t>(FloatBits(p0[i]) >> 16);
      g16[i] = static_cast<uint16_t>(FloatBits(g0[i]) >> 16);
      m0[i] = static_cast<uint8_t>(rng());
      v0[i] = static_cast<uint8_t>(rng());
    }
    for (int64_t i = 0; i < slots; ++i) {
      ma0[i] = std::fabs(normal(rng)) * 1e-2f;
      va0[i] = std::fabs(normal(rng)) * 1e-4f;
    }
    const AdamWStepScalars s = MakeAdamWStepScalars(AdamWOptions{}, 3);
    const ParamRounding rounding = MakeParamRounding(true, 11, 2, 3, 40);
    auto run = [&](CpuIsa isa, std::vector<float>& p, std::vector<uint16_t>& q,
                   std::vector<uint8_t>& m, std::vector<uint8_t>& v, std::vector<float>& ma,
                   std::vector<float>& va, std::vector<uint8_t>& m16, std::vector<uint8_t>& v16,
                   std::vector<float>& ma16, std::vector<float>& va16) {
      p = p0, q = p16, m = m0, v = v0, ma = ma0, va = va0, m16 = m0, v16 = v0, ma16 = ma0,
      va16 = va0;
      KernelsFor(isa).adamw8bit(s, clip, n, blocks, p.data(), g0.data(), m.data(), v.data(),
                                ma.data(), va.data(), &TorchSqrt);
      KernelsFor(isa).adamw8bit_bf16(s, clip, n, blocks, q.data(), g16.data(), m16.data(),
                                     v16.data(), ma16.data(), va16.data(), &TorchSqrt, rounding);
    };
    std::vector<float> rp, rma, rva, rma16, rva16;
    std::vector<uint16_t> rq;
    std::vector<uint8_t> rm, rv, rm16, rv16;
    run(CpuIsa::kPortable, rp, rq, rm, rv, rma, rva, rm16, rv16, rma16, rva16);
    for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (!CpuIsaSupported(isa)) continue;
      std::vector<float> p, ma, va, ma16, va16;
      std::vector<uint16_t> q;
      std::vector<uint8_t> m, v, m16, v16;
      run(isa, p, q, m, v, ma, va, m16, v16, ma16, va16);
      EXPECT_EQ(0, std::memcmp(p.data(), rp.data(), n * sizeof(float))) << CpuIsaName(isa);
      EXPECT_EQ(q, rq) << CpuIsaName(isa);
      EXPECT_EQ(m, rm) << CpuIsaName(isa);
      EXPECT_EQ(v, rv) << CpuIsaName(isa);
      EXPECT_EQ(m16, rm16) << CpuIsaName(isa);
      EXPECT_EQ(v16, rv16) << CpuIsaName(isa);
      EXPECT_EQ(0, std::memcmp(ma.data(), rma.data(), slots * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(va16.data(), rva16.data(), slots * sizeof(float)));
    }
  }
}

// The 8-bit update written element by element in the kernel's order of IEEE operations (the
// contract of cpu_adamw.h): dequantize, widen, moments, sqrt_fn over the same groups of whole
// blocks (<= kSqrtBlockElems elements: torch's sqrt kernel may round by position), the parameter,
// its bf16 rounding, then each block's absmax (fmax over |x|, NaN skipped) and NearestCode8bit of
// the clamped scaled value. Independent of the vector code, so every variant is held to it.
uint16_t NearestEvenBf16(float x) {
  if (std::isnan(x)) return 0x7FC0;
  const uint32_t bits = FloatBits(x);
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

void ScalarAdamW8bit(bool bf16, const AdamWStepScalars& s, float grad_scale, int64_t n,
                     const QuantBlocks& blocks, void* param, const void* grad, uint8_t* m8,
                     uint8_t* v8, float* m_absmax, float* v_absmax, VectorSqrtFn sqrt_fn,
                     const ParamRounding& rounding) {
  auto block_len = [&](int64_t b, int64_t left) {
    return std::min(left, b == 0 ? blocks.first_block_elems : int64_t{256});
  };
  auto slot = [&](int64_t b) {
    return b == 0 ? 0 : blocks.first_slot_gap + (b - 1) * blocks.slot_stride;
  };
  std::vector<float> m(kSqrtBlockElems), v(kSqrtBlockElems), sv(kSqrtBlockElems);
  int64_t begin = 0, block = 0;
  while (begin < n) {
    const int64_t first_block = block;
    int64_t end = begin;
    while (end < n && end + block_len(block, n - end) - begin <= kSqrtBlockElems) {
      const int64_t len = block_len(block, n - end);
      for (int64_t i = end; i < end + len; ++i) {
        m[i - begin] = kSignedDynamicMap[m8[i]] * m_absmax[slot(block)];
        v[i - begin] = kUnsignedDynamicMap[v8[i]] * v_absmax[slot(block)];
      }
      end += len;
      ++block;
    }
    for (int64_t i = begin; i < end; ++i) {
      float g;
      if (bf16) {
        g = Bf16BitsToFloat(static_cast<const uint16_t*>(grad)[i]);
        if (grad_scale != 1.0f) g = Bf16BitsToFloat(NearestEvenBf16(g * grad_scale));
        g = g * 1.0f;
      } else {
        g = static_cast<const float*>(grad)[i] * grad_scale;
      }
      float& mi = m[i - begin];
      float& vi = v[i - begin];
      mi = std::fma(g, s.one_minus_beta1, mi * s.beta1);
      vi = std::fma(s.one_minus_beta2 * g, g, vi * s.beta2);
    }
    if (sqrt_fn != nullptr) {
      sqrt_fn(v.data(), sv.data(), end - begin);
    } else {
      for (int64_t i = 0; i < end - begin; ++i) sv[i] = std::sqrt(v[i]);
    }
    for (int64_t i = begin; i < end; ++i) {
      const float denom = sv[i - begin] / s.bias_correction2_sqrt + s.eps;
      const float p0 = bf16 ? Bf16BitsToFloat(static_cast<uint16_t*>(param)[i])
                            : static_cast<float*>(param)[i];
      const float p = p0 * s.weight_decay_factor + (s.neg_step_size * m[i - begin]) / denom;
      if (!bf16) {
        static_cast<float*>(param)[i] = p;
      } else if (rounding.stochastic) {
        static_cast<uint16_t*>(param)[i] = Bf16BitsStochastic(
            FloatBits(p), rounding.key, static_cast<uint64_t>(rounding.first + i));
      } else {
        static_cast<uint16_t*>(param)[i] = NearestEvenBf16(p);
      }
    }
    int64_t at = begin;
    for (int64_t b = first_block; b < block; ++b) {
      const int64_t len = block_len(b, end - at);
      for (auto [x, codes, absmax_out, map] :
           {std::tuple{m.data(), m8, m_absmax, kSignedDynamicMap},
            std::tuple{v.data(), v8, v_absmax, kUnsignedDynamicMap}}) {
        float absmax = -FLT_MAX;
        for (int64_t i = at; i < at + len; ++i) absmax = std::fmax(absmax, std::fabs(x[i - begin]));
        const float inv = absmax > 0 ? 1.0f / absmax : 0.0f;
        for (int64_t i = at; i < at + len; ++i) {
          codes[i] = NearestCode8bit(map, std::clamp(x[i - begin] * inv, -1.0f, 1.0f));
        }
        absmax_out[slot(b)] = absmax;
      }
      at += len;
    }
    begin = end;
  }
}

// A square root that marks each result with its position in the call (its lowest bit flipped
// at odd positions): a kernel that groups the elements of its sqrt calls differently from
// ScalarAdamW8bit gives other bits.
void PositionalSqrt(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = FloatBits(std::sqrt(in[i])) ^ static_cast<uint32_t>(i & 1);
    std::memcpy(&out[i], &bits, sizeof(bits));
  }
}

// Every variant against ScalarAdamW8bit, two steps in a row: lengths around the vector widths,
// the 256-element blocks and the sqrt groups, first blocks cut short, strided absmax slots,
// clipping, both roundings, both square roots, and data with zeros, -0, NaN, infinities,
// denormals, huge values (whose squares overflow) and absmax slots of 0, -FLT_MAX and inf.
TEST(AdamW8bitIsaTest, UpdateOfEveryVariantMatchesTheScalarDefinition) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto special = [&](float x, int kind) {
    switch (rng() % 64) {
      case 0: return 0.0f;
      case 1: return -0.0f;
      case 2: return kind == 0 ? nan : x;
      case 3: return kind == 0 ? inf : x;
      case 4: return kind == 0 ? -inf : x;
      case 5: return 1e-40f * x;  // denormal
      case 6: return 3e37f * x;   // its square overflows
      default: return x;
    }
  };
  int trial = 0;
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{255},
                          int64_t{256}, int64_t{257}, int64_t{2047}, int64_t{2048},
                          int64_t{2049}, int64_t{5013}, int64_t{9000}}) {
    for (const int64_t first : {int64_t{256}, int64_t{100}, int64_t{1}, int64_t{255}}) {
      ++trial;
      QuantBlocks blocks;
      blocks.first_block_elems = first;
      blocks.first_slot_gap = 1 + trial % 3;
      blocks.slot_stride = 1 + trial % 2;
      const int64_t slots = blocks.first_slot_gap + blocks.slot_stride * (n / 256 + 2);
      const bool bf16 = trial % 2 == 0;
      const float clip = trial % 3 == 0 ? 0.37f : 1.0f;
      const VectorSqrtFn sqrt_fn = trial % 4 == 1   ? nullptr
                                   : trial % 4 == 2 ? &PositionalSqrt
                                                    : &TorchSqrt;
      const ParamRounding rounding = MakeParamRounding(trial % 5 != 0, 11, 2, trial, 40);
      const int data = trial % 3;  // 0: specials everywhere, 1: a few zero blocks, 2: plain
      std::vector<float> p32(n), g32(n);
      std::vector<uint16_t> p16(n), g16(n);
      std::vector<uint8_t> m8(n), v8(n);
      std::vector<float> ma(slots), va(slots);
      float scale = 1.0f;
      for (int64_t i = 0; i < n; ++i) {
        if (i % 64 == 0) scale = std::exp2(4.0f * normal(rng));
        p32[i] = normal(rng);
        g32[i] = normal(rng) * 1e-3f * scale;
        if (data == 0) {
          p32[i] = special(p32[i], rng() % 4);
          g32[i] = special(g32[i], rng() % 4);
        }
        if (data == 1 && (i / 256) % 3 == 1) g32[i] = 0.0f;
        p16[i] = static_cast<uint16_t>(FloatBits(p32[i]) >> 16);
        g16[i] = static_cast<uint16_t>(FloatBits(g32[i]) >> 16);
        m8[i] = static_cast<uint8_t>(rng());
        v8[i] = static_cast<uint8_t>(rng());
      }
      for (int64_t i = 0; i < slots; ++i) {
        ma[i] = std::fabs(normal(rng)) * 1e-2f;
        va[i] = std::fabs(normal(rng)) * 1e-4f;
        if (data == 0 && i % 7 == 3) ma[i] = i % 2 ? 0.0f : -FLT_MAX;
        if (data == 0 && i % 11 == 5) va[i] = i % 2 ? inf : 0.0f;
        if (data == 1 && i % 5 == 2) ma[i] = va[i] = 0.0f;
      }
      struct State {
        std::vector<float> p32;
        std::vector<uint16_t> p16;
        std::vector<uint8_t> m8, v8;
        std::vector<float> ma, va;
      };
      auto run = [&](std::optional<CpuIsa> isa) {
        State st{p32, p16, m8, v8, ma, va};
        for (int64_t step = 1; step <= 2; ++step) {
          const AdamWStepScalars s =
              MakeAdamWStepScalars(AdamWOptions{1e-3, 0.9, 0.999, 1e-8, 0.01}, step);
          ParamRounding r = rounding;
          r.key += static_cast<uint64_t>(step);
          void* param = bf16 ? static_cast<void*>(st.p16.data()) : st.p32.data();
          const void* grad = bf16 ? static_cast<const void*>(g16.data()) : g32.data();
          if (!isa) {
            ScalarAdamW8bit(bf16, s, clip, n, blocks, param, grad, st.m8.data(), st.v8.data(),
                            st.ma.data(), st.va.data(), sqrt_fn, r);
          } else if (bf16) {
            KernelsFor(*isa).adamw8bit_bf16(s, clip, n, blocks, st.p16.data(), g16.data(),
                                            st.m8.data(), st.v8.data(), st.ma.data(),
                                            st.va.data(), sqrt_fn, r);
          } else {
            KernelsFor(*isa).adamw8bit(s, clip, n, blocks, st.p32.data(), g32.data(),
                                       st.m8.data(), st.v8.data(), st.ma.data(), st.va.data(),
                                       sqrt_fn);
          }
        }
        return st;
      };
      const State want = run(std::nullopt);
      for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
        if (!CpuIsaSupported(isa)) continue;
        const State got = run(isa);
        const std::string at = std::string(CpuIsaName(isa)) + " n " + std::to_string(n) +
                               " first " + std::to_string(first) + " trial " +
                               std::to_string(trial);
        // fp32 parameters bit for bit; of a NaN only that it is one (which operand's NaN an
        // add returns is the compiler's choice of operand order, here and in the kernels).
        for (int64_t i = 0; i < n; ++i) {
          if (std::isnan(got.p32[i]) && std::isnan(want.p32[i])) continue;
          ASSERT_EQ(FloatBits(got.p32[i]), FloatBits(want.p32[i])) << at << " element " << i;
        }
        ASSERT_EQ(got.p16, want.p16) << at;
        ASSERT_EQ(got.m8, want.m8) << at;
        ASSERT_EQ(got.v8, want.v8) << at;
        ASSERT_EQ(0, std::memcmp(got.ma.data(), want.ma.data(), slots * sizeof(float))) << at;
        ASSERT_EQ(0, std::memcmp(got.va.data(), want.va.data(), slots * sizeof(float))) << at;
      }
    }
  }
}

}  // namespace
}  // namespace memplan
