// NF4 quantization (agent/quant/nf4.h) against a reference written here from the published
// definition (QLoRA, Dettmers et al. 2023, and bitsandbytes' documentation): the 16 NF4 values,
// block-wise absmax, nearest-value rounding; double quantization of the absmax with the signed
// 8-bit dynamic map. Plain scalar C++, no LibTorch math.
#include "agent/quant/nf4.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/nf4_bytes.h"

namespace memplan::quant {
namespace {

// NormalFloat4: quantiles of N(0, 1) normalised to [-1, 1], with an exact 0 (QLoRA, appendix E).
constexpr double kRefNf4[16] = {-1.0,
                                -0.6961928009986877,
                                -0.5250730514526367,
                                -0.39491748809814453,
                                -0.28444138169288635,
                                -0.18477343022823334,
                                -0.09105003625154495,
                                0.0,
                                0.07958029955625534,
                                0.16093020141124725,
                                0.24611230194568634,
                                0.33791524171829224,
                                0.44070982933044434,
                                0.5626170039176941,
                                0.7229568362236023,
                                1.0};

float Nf4Ref(int i) { return static_cast<float>(kRefNf4[i]); }

// Index of the value of `table` nearest to v; an exact tie goes to the lower index.
int Nearest(double v, const std::vector<double>& table) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(table.size()); ++i) {
    if (std::fabs(v - table[i]) < std::fabs(v - table[best])) best = i;
  }
  return best;
}

// The signed dynamic 8-bit map from its definition (Dettmers 2015, bitsandbytes'
// create_dynamic_map): for exponent e = 0..6, 2^e linear fractions (midpoints of 2^e equal steps
// over [0.1, 1]) times 10^(e-6), both signs, plus 0 and 1; ascending. In double.
std::vector<double> RefDynamicMap() {
  std::vector<double> v;
  for (int e = 0; e < 7; ++e) {
    const int k = 1 << e;
    for (int j = 0; j < k; ++j) {
      const double lo = 0.1 + 0.9 * j / k, hi = 0.1 + 0.9 * (j + 1) / k;
      const double m = (lo + hi) / 2 * std::pow(10.0, e - 6);
      v.push_back(m);
      v.push_back(-m);
    }
  }
  v.push_back(0);
  v.push_back(1);
  std::sort(v.begin(), v.end());
  return v;
}

uint16_t Bf16Rne(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t lsb = (bits >> 16) & 1;
  return static_cast<uint16_t>((bits + 0x7FFF + lsb) >> 16);
}

struct RefQuant {
  std::vector<uint8_t> data;
  std::vector<float> absmax;  // exact block absmax (before double quantization)
  std::vector<int> absmax_code;
  std::vector<float> absmax_scale;
};

// Reference quantization of fp32 values. `offset` is the mean of the absmax values, which the
// implementation computes with torch's summation order: the caller passes the implementation's
// after checking it against the exact mean.
RefQuant RefQuantize(const std::vector<float>& x, int64_t bs, float offset,
                     const std::vector<double>& map) {
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t blocks = (n + bs - 1) / bs;
  RefQuant r;
  r.data.assign((n + 1) / 2, 0);
  r.absmax.resize(blocks);
  std::vector<double> nf4(kRefNf4, kRefNf4 + 16);
  std::vector<int> codes(n + 1, 7);  // a pad element is 0.0, code 7
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * bs, hi = std::min(n, lo + bs);
    float am = 0;
    for (int64_t i = lo; i < hi; ++i) am = std::max(am, std::fabs(x[i]));
    const bool partial = hi - lo < bs;
    const float denom = std::max(am, 1e-38f);
    r.absmax[b] = partial ? denom : am;  // bitsandbytes keeps the clamped absmax of a tail block
    const float inv = 1.0f / denom;
    for (int64_t i = lo; i < hi; ++i) {
      // Full blocks multiply by the reciprocal, a partial tail divides (bitsandbytes' CPU path).
      float v = partial ? x[i] / denom : x[i] * inv;
      v = std::min(1.0f, std::max(-1.0f, v));
      codes[i] = Nearest(v, nf4);
    }
  }
  for (int64_t k = 0; k < (n + 1) / 2; ++k) {
    r.data[k] = static_cast<uint8_t>((codes[2 * k] << 4) | codes[2 * k + 1]);
  }
  const int64_t blocks2 = (blocks + 255) / 256;
  r.absmax_code.resize(blocks);
  r.absmax_scale.resize(blocks2);
  for (int64_t b = 0; b < blocks2; ++b) {
    const int64_t lo = b * 256, hi = std::min(blocks, lo + 256);
    float am = 0;
    for (int64_t i = lo; i < hi; ++i) am = std::max(am, std::fabs(r.absmax[i] - offset));
    r.absmax_scale[b] = am;
    for (int64_t i = lo; i < hi; ++i) {
      const float v = am == 0 ? 0.0f : (r.absmax[i] - offset) * (1.0f / am);
      r.absmax_code[i] = am == 0 ? 0 : Nearest(std::min(1.0f, std::max(-1.0f, v)), map);
    }
  }
  return r;
}

std::vector<float> ToVector(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kCPU, torch::kFloat32).contiguous().view({-1});
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

std::vector<double> ImplMap() {
  const std::vector<float> m = ToVector(DynamicMap8Bit());
  return std::vector<double>(m.begin(), m.end());
}

TEST(Nf4Test, DynamicMapMatchesItsDefinition) {
  const std::vector<double> ref = RefDynamicMap();
  const std::vector<double> impl = ImplMap();
  ASSERT_EQ(impl.size(), 256u);
  for (int i = 0; i < 256; ++i) {
    // The implementation rounds the fractions in fp32 as bitsandbytes does (linspace in fp32).
    EXPECT_NEAR(impl[i], ref[i], 2e-7 * std::max(1e-6, std::fabs(ref[i]))) << i;
  }
  EXPECT_EQ(impl.front(), static_cast<double>(-0.99296875f));
  EXPECT_EQ(impl.back(), 1.0);
}

TEST(Nf4Test, ValuesAreThePublishedTable) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(Nf4Values()[i], Nf4Ref(i)) << i;
}

// A matrix with some structure: gaussian rows of different scales, a zero block, values exactly
// on NF4 values, and the block maximum in both signs.
torch::Tensor TestWeight(int64_t rows, int64_t cols, torch::ScalarType dtype, int seed) {
  torch::manual_seed(seed);
  torch::Tensor w = torch::randn({rows, cols}) * torch::linspace(0.01, 3.0, rows).unsqueeze(1);
  w = w.view({-1});
  if (w.numel() >= 256) {
    w.slice(0, 64, 128).zero_();
    for (int i = 0; i < 16; ++i) w[128 + i] = Nf4Ref(i) * 2.5f;
    w[200] = -7.0f;
  }
  return w.view({rows, cols}).to(dtype);
}

void ExpectEqualsReference(const torch::Tensor& w, int64_t bs) {
  SCOPED_TRACE(testing::Message() << "shape " << w.sizes() << " dtype " << w.scalar_type()
                                  << " blocksize " << bs);
  absl::StatusOr<Nf4Tensor> q = QuantizeNf4(w, bs);
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_TRUE(ValidateNf4(*q).ok()) << ValidateNf4(*q);
  EXPECT_EQ(q->shape, w.sizes().vec());
  const std::vector<float> x = ToVector(w);
  const std::vector<double> map = ImplMap();

  // The offset is the mean of the block absmax values; torch sums in its own order.
  const int64_t blocks = q->n_blocks();
  RefQuant probe = RefQuantize(x, bs, 0.0f, map);
  double mean = 0;
  for (float a : probe.absmax) mean += a;
  mean /= static_cast<double>(blocks);
  EXPECT_NEAR(q->absmax_offset, mean, 4e-7 * mean + 1e-30);
  const RefQuant ref = RefQuantize(x, bs, q->absmax_offset, map);

  // 4-bit codes: bit for bit.
  const torch::Tensor data = q->data.cpu();
  ASSERT_EQ(data.numel(), static_cast<int64_t>(ref.data.size()));
  int64_t diff_bytes = 0;
  for (int64_t k = 0; k < data.numel(); ++k) diff_bytes += data.data_ptr<uint8_t>()[k] != ref.data[k];
  EXPECT_EQ(diff_bytes, 0);

  // Double quantization: scales bit for bit; codes equal the nearest code, or (bitsandbytes'
  // 65536-entry rounding table) a code at most one table step (2/65535) farther from the value.
  const std::vector<float> scale = ToVector(q->absmax_scale);
  ASSERT_EQ(scale.size(), ref.absmax_scale.size());
  for (size_t b = 0; b < scale.size(); ++b) EXPECT_EQ(scale[b], ref.absmax_scale[b]) << b;
  const torch::Tensor codes = q->absmax_code.cpu();
  int64_t not_nearest = 0;
  for (int64_t i = 0; i < blocks; ++i) {
    const int got = codes.data_ptr<uint8_t>()[i];
    const int want = ref.absmax_code[i];
    if (got == want) continue;
    ++not_nearest;
    const float am = ref.absmax_scale[i / 256];
    const double v = std::min(1.0f, std::max(-1.0f, (ref.absmax[i] - q->absmax_offset) * (1.0f / am)));
    EXPECT_LE(std::fabs(v - map[got]), std::fabs(v - map[want]) + 2.0 / 65535) << i;
  }
  EXPECT_LE(not_nearest, blocks / 100 + 1);

  // Dequantization from the stored codes, bit for bit in fp32 and bf16.
  std::vector<float> am_deq(blocks);
  for (int64_t i = 0; i < blocks; ++i) {
    const float prod = static_cast<float>(map[codes.data_ptr<uint8_t>()[i]]) * scale[i / 256];
    am_deq[i] = prod + q->absmax_offset;
  }
  const std::vector<float> am_impl = ToVector(DequantizeAbsmax(*q));
  for (int64_t i = 0; i < blocks; ++i) ASSERT_EQ(am_impl[i], am_deq[i]) << i;

  const std::vector<float> out32 = ToVector(DequantizeNf4(*q, torch::kFloat32));
  const torch::Tensor out16 = DequantizeNf4(*q, torch::kBFloat16).cpu().contiguous().view({-1});
  ASSERT_EQ(out16.scalar_type(), torch::kBFloat16);
  const uint16_t* bf = reinterpret_cast<const uint16_t*>(out16.data_ptr());
  int64_t diff32 = 0, diff16 = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    const uint8_t byte = data.data_ptr<uint8_t>()[i / 2];
    const int c = i % 2 == 0 ? byte >> 4 : byte & 15;
    const float v = Nf4Ref(c) * am_deq[i / bs];
    diff32 += out32[i] != v;
    diff16 += bf[i] != Bf16Rne(v);
  }
  EXPECT_EQ(diff32, 0);
  EXPECT_EQ(diff16, 0);

  // Round trip: |w - w'| <= h * absmax + |absmax' - absmax| per element, h = 0.15190 the
  // largest half-gap of the NF4 values (between -1 and -0.6962); and the double-quantized absmax
  // is off by at most 0.00704 (half the largest gap of the dynamic map, near +-1) + 2/65535 (its
  // rounding table) of its block's scale, plus fp32 rounding.
  double h = 0;
  for (int i = 0; i < 15; ++i) h = std::max(h, (kRefNf4[i + 1] - kRefNf4[i]) / 2);
  EXPECT_NEAR(h, 0.15190, 1e-5);
  for (int64_t i = 0; i < blocks; ++i) {
    const double scale_b = scale[i / 256];
    EXPECT_LE(std::fabs(am_deq[i] - ref.absmax[i]),
              (0.00704 + 2.0 / 65535) * scale_b + 1e-6 * std::fabs(ref.absmax[i]))
        << i;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    const int64_t b = i / bs;
    const double bound = h * ref.absmax[b] + std::fabs(am_deq[b] - ref.absmax[b]) +
                         1e-6 * std::fabs(ref.absmax[b]);
    ASSERT_LE(std::fabs(out32[i] - x[i]), bound) << i;
  }
}

TEST(Nf4Test, QuantizeAndDequantizeEqualTheReference) {
  ExpectEqualsReference(TestWeight(96, 640, torch::kFloat32, 1), 64);     // 960 blocks: 4 scales
  ExpectEqualsReference(TestWeight(48, 512, torch::kBFloat16, 2), 64);
  ExpectEqualsReference(TestWeight(32, 256, torch::kFloat16, 3), 64);
  ExpectEqualsReference(TestWeight(7, 9, torch::kFloat32, 4), 64);        // one odd partial block
  ExpectEqualsReference(TestWeight(37, 301, torch::kBFloat16, 5), 64);    // partial tail, odd n
  ExpectEqualsReference(TestWeight(64, 256, torch::kFloat32, 6), 128);
  ExpectEqualsReference(TestWeight(16, 64, torch::kFloat32, 7).view({4, 4, 64}), 32);
}

TEST(Nf4Test, LargeWeightSpansSeveralPasses) {
  // More than one quantization pass (4M elements) and one dequantization slice (1M).
  ExpectEqualsReference(TestWeight(1100, 4000, torch::kBFloat16, 8), 64);
}

// [Sharded NF4 loading] The absmax state of the whole weight and the data of any run of whole
// blocks (or the last ones) are the bytes of QuantizeNf4's result.
TEST(Nf4Test, PartsEqualTheWholeQuantization) {
  struct Case {
    int64_t rows, cols, blocksize;
  };
  for (const Case& c : {Case{96, 640, 64}, Case{37, 301, 64}, Case{7, 9, 64}, Case{1100, 4000, 64},
                        Case{64, 256, 128}}) {
    SCOPED_TRACE(testing::Message() << c.rows << "x" << c.cols << " / " << c.blocksize);
    const torch::Tensor w = TestWeight(c.rows, c.cols, torch::kBFloat16, 21);
    absl::StatusOr<Nf4Tensor> whole = QuantizeNf4(w, c.blocksize);
    ASSERT_TRUE(whole.ok()) << whole.status();
    absl::StatusOr<Nf4AbsmaxState> state = QuantizeNf4Absmax(w, c.blocksize);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_TRUE(torch::equal(state->absmax_code, whole->absmax_code));
    EXPECT_TRUE(torch::equal(state->absmax_scale, whole->absmax_scale));
    EXPECT_EQ(std::memcmp(&state->absmax_offset, &whole->absmax_offset, sizeof(float)), 0);
    const int64_t n = w.numel(), blocks = whole->n_blocks();
    const torch::Tensor flat = w.reshape({-1});
    for (const auto& [b0, b1] : {std::pair<int64_t, int64_t>{0, blocks}, {0, 1}, {1, blocks},
                                 {blocks / 3, 2 * blocks / 3 + 1}, {blocks - 1, blocks}}) {
      if (b0 >= b1) continue;
      const int64_t e0 = b0 * c.blocksize, e1 = std::min(b1 * c.blocksize, n);
      absl::StatusOr<torch::Tensor> data =
          QuantizeNf4Blocks(flat.slice(0, e0, e1), b0, n, c.blocksize);
      ASSERT_TRUE(data.ok()) << data.status();
      EXPECT_TRUE(torch::equal(*data, whole->data.slice(0, e0 / 2, (e1 + 1) / 2)))
          << "blocks [" << b0 << ", " << b1 << ")";
    }
  }
  // Not whole blocks, and not the weight's last elements.
  const torch::Tensor w = torch::ones({200});
  EXPECT_EQ(QuantizeNf4Blocks(w.slice(0, 0, 100), 0, 200).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeNf4Blocks(w.slice(0, 0, 40), 1, 200).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Nf4Test, ZeroBlocksDequantizeToZero) {
  const torch::Tensor w = torch::zeros({4, 64});
  absl::StatusOr<Nf4Tensor> q = QuantizeNf4(w);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(torch::equal(q->data, torch::full({128}, 0x77, torch::kUInt8)));
  EXPECT_TRUE(torch::equal(DequantizeNf4(*q, torch::kFloat32), w));
}

TEST(Nf4Test, StorageBytesAreTheCommonDefinition) {
  for (int64_t n : {1, 63, 64, 65, 16384, 16385, (1 << 20) + 1}) {
    absl::StatusOr<Nf4Tensor> q = QuantizeNf4(torch::ones({n}));
    ASSERT_TRUE(q.ok()) << q.status();
    const Nf4PartBytes p = Nf4Parts(n);
    EXPECT_EQ(q->data.numel(), p.data_bytes) << n;
    EXPECT_EQ(q->absmax_code.numel(), p.absmax_code_bytes) << n;
    EXPECT_EQ(q->absmax_scale.numel() * 4, p.absmax_scale_bytes) << n;
  }
}

TEST(Nf4Test, RefusesWhatItCannotQuantize) {
  EXPECT_EQ(QuantizeNf4(torch::ones({8}, torch::kInt32)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeNf4(torch::ones({8}), 48).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeNf4(torch::ones({8}), 8192).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeNf4(torch::empty({0})).status().code(), absl::StatusCode::kInvalidArgument);
  torch::Tensor nan = torch::ones({8});
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(QuantizeNf4(nan).status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<Nf4Tensor> q = QuantizeNf4(torch::ones({130}));
  ASSERT_TRUE(q.ok());
  Nf4Tensor bad = *q;
  bad.absmax_code = bad.absmax_code.slice(0, 0, 2);
  const absl::Status s = ValidateNf4(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("absmax_code"), std::string::npos) << s;
}

TEST(Nf4Test, KernelRefusesCpuTensors) {
  absl::StatusOr<Nf4Tensor> q = QuantizeNf4(torch::ones({64}));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(DequantizeNf4Kernel(*q, torch::kBFloat16).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---- GPU: the CUDA kernel and the ops path against the CPU result; dequantization rate ----

class Nf4GpuTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(Nf4GpuTest, DeviceResultsEqualTheCpu) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{96, 640}, {37, 301}}) {
    const torch::Tensor w = TestWeight(rows, cols, torch::kBFloat16, 11);
    absl::StatusOr<Nf4Tensor> cpu = QuantizeNf4(w);
    ASSERT_TRUE(cpu.ok());
    const Nf4Tensor dev = cpu->To(torch::Device(torch::kCUDA, 0));
    for (torch::ScalarType t : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
      const torch::Tensor want = DequantizeNf4Ops(*cpu, t);
      EXPECT_TRUE(torch::equal(DequantizeNf4Ops(dev, t).cpu(), want)) << t;
      if (Nf4CudaKernelBuilt()) {
        absl::StatusOr<torch::Tensor> k = DequantizeNf4Kernel(dev, t);
        ASSERT_TRUE(k.ok()) << k.status();
        EXPECT_TRUE(torch::equal(k->cpu(), want)) << t;
      }
    }
    // Quantized on the device: the same 4-bit codes and scales; the offset (a mean) may differ
    // in its last bits.
    absl::StatusOr<Nf4Tensor> on_dev = QuantizeNf4(w.cuda());
    ASSERT_TRUE(on_dev.ok());
    EXPECT_TRUE(torch::equal(on_dev->data.cpu(), cpu->data));
    EXPECT_NEAR(on_dev->absmax_offset, cpu->absmax_offset, 4e-7 * std::fabs(cpu->absmax_offset));
  }
}

// A full-size weight: the kernel and the ops path agree bit for bit beyond the small cases above
// (several grid strides of the kernel), and the rate of each is printed for docs/benchmarks.md.
TEST_F(Nf4GpuTest, FullSizeWeightDequantizesAlikeOnBothPaths) {
  // Qwen2.5-32B's MLP projection (27648 x 5120) to bf16; GB/s counts bytes read + written.
  const torch::Tensor w = torch::randn({27648, 5120}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  absl::StatusOr<Nf4Tensor> q = QuantizeNf4(w);
  ASSERT_TRUE(q.ok()) << q.status();
  const torch::Tensor ops = DequantizeNf4Ops(*q, torch::kBFloat16);
  ASSERT_EQ(ops.sizes(), w.sizes());
  // NF4 keeps every value within its block's absmax: the largest error is bounded by it.
  EXPECT_LE((ops.to(torch::kFloat32) - w.to(torch::kFloat32)).abs().max().item<float>(),
            w.abs().max().item<float>());
  const double bytes = static_cast<double>(Nf4Parts(w.numel()).total() + w.numel() * 2);
  auto rate = [&](auto&& fn) {
    fn();
    torch::cuda::synchronize();
    const int reps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    torch::cuda::synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return bytes * reps / s / 1e9;
  };
  std::printf("nf4 dequant 27648x5120 -> bf16: ops %.1f GB/s", rate([&] { DequantizeNf4Ops(*q, torch::kBFloat16); }));
  if (Nf4CudaKernelBuilt()) {
    absl::StatusOr<torch::Tensor> kernel = DequantizeNf4Kernel(*q, torch::kBFloat16);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_TRUE(torch::equal(*kernel, ops));
    std::printf(", kernel %.1f GB/s", rate([&] { (void)DequantizeNf4Kernel(*q, torch::kBFloat16); }));
  }
  std::printf("\n");
}

}  // namespace
}  // namespace memplan::quant
