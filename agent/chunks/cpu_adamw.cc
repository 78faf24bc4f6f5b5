// Compiled with -ffp-contract=off (see CMakeLists.txt): the only fused multiply-adds are the
// explicit std::fma calls below, placed exactly where torch's vectorised kernels use
// vec::fmadd (add with alpha: fmadd(other, alpha, self); addcmul: the last multiply fused with
// the add). Everything else is one IEEE operation per step in torch's order, so vectorising these
// loops cannot change a single bit. -fno-math-errno lets std::sqrt vectorise.
#include "agent/chunks/cpu_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// The hot loops get an x86-64-v3 (AVX2 + FMA) clone chosen at load time; other CPUs run the
// portable version, whose std::fma is still a correctly rounded fused multiply-add.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MEMPLAN_VECTOR_CLONES __attribute__((target_clones("arch=haswell", "default")))
#else
#define MEMPLAN_VECTOR_CLONES
#endif

namespace memplan {

AdamWStepScalars MakeAdamWStepScalars(const AdamWOptions& options, int64_t step) {
  // Mirrors torch/csrc/api/src/optim/adamw.cpp: scalars are computed in double and converted to
  // float when they reach an fp32 kernel.
  AdamWStepScalars s;
  s.weight_decay_factor =
      options.weight_decay != 0 ? static_cast<float>(1 - options.lr * options.weight_decay) : 1.0f;
  const double bias_correction1 = 1 - std::pow(options.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(options.beta2, static_cast<double>(step));
  s.beta1 = static_cast<float>(options.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - options.beta1);
  s.beta2 = static_cast<float>(options.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - options.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(options.eps);
  s.neg_step_size = static_cast<float>(-(options.lr / bias_correction1));
  return s;
}

namespace {

MEMPLAN_VECTOR_CLONES
void StdSqrt(const float* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = std::sqrt(in[i]);
}

// First half of torch's order: the moments (grad already scaled by the clip coefficient).
MEMPLAN_VECTOR_CLONES
void UpdateMoments(const AdamWStepScalars& s, float grad_scale, int64_t n,
                   const float* __restrict grad, float* __restrict exp_avg,
                   float* __restrict exp_avg_sq) {
  const float b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2, c2 = s.one_minus_beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;                     // clip: grad.mul_(coef)
    exp_avg[i] = std::fma(g, c1, exp_avg[i] * b1);            // .mul_(b1).add_(g, 1 - b1)
    exp_avg_sq[i] = std::fma(c2 * g, g, exp_avg_sq[i] * b2);  // .mul_(b2).addcmul_(g, g, 1-b2)
  }
}

// Second half: weight decay first (torch decays before the moments, which do not read the
// parameter, so the order of the two halves is unobservable), then addcdiv.
MEMPLAN_VECTOR_CLONES
void UpdateParams(const AdamWStepScalars& s, int64_t n, const float* __restrict sqrt_v,
                  const float* __restrict exp_avg, float* __restrict param) {
  const float wd = s.weight_decay_factor, bc2 = s.bias_correction2_sqrt, eps = s.eps;
  const float step = s.neg_step_size;
  for (int64_t i = 0; i < n; ++i) {
    const float denom = sqrt_v[i] / bc2 + eps;               // (v.sqrt() / sqrt(bc2)).add_(eps)
    param[i] = param[i] * wd + (step * exp_avg[i]) / denom;  // p.mul_(wd); p.addcdiv_(m, d, -ss)
  }
}

}  // namespace

void AdamWUpdate(const AdamWStepScalars& s, float grad_scale, int64_t n, float* param,
                 const float* grad, float* exp_avg, float* exp_avg_sq, VectorSqrtFn sqrt_fn) {
  if (sqrt_fn == nullptr) sqrt_fn = &StdSqrt;
  float sqrt_v[kSqrtBlockElems];
  for (int64_t begin = 0; begin < n; begin += kSqrtBlockElems) {
    const int64_t len = std::min(kSqrtBlockElems, n - begin);
    UpdateMoments(s, grad_scale, len, grad + begin, exp_avg + begin, exp_avg_sq + begin);
    sqrt_fn(exp_avg_sq + begin, sqrt_v, len);
    UpdateParams(s, len, sqrt_v, exp_avg + begin, param + begin);
  }
}

MEMPLAN_VECTOR_CLONES
void AccumulateGrad(bool first, int64_t n, const float* __restrict in, float* __restrict accum) {
  if (first) {
    std::memcpy(accum, in, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) accum[i] = accum[i] + in[i];
}

namespace {
inline float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}
}  // namespace

MEMPLAN_VECTOR_CLONES
void AccumulateGradBf16(bool first, int64_t n, const uint16_t* __restrict in,
                        float* __restrict accum) {
  if (first) {
    for (int64_t i = 0; i < n; ++i) accum[i] = Bf16BitsToFloat(in[i]);
    return;
  }
  for (int64_t i = 0; i < n; ++i) accum[i] = accum[i] + Bf16BitsToFloat(in[i]);
}

namespace {
inline uint16_t FloatToBf16Bits(float value) {
  if (std::isnan(value)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t rounding_bias = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}
}  // namespace

MEMPLAN_VECTOR_CLONES
void AccumulateGradBf16Rounded(bool first, int64_t n, const uint16_t* __restrict in,
                               uint16_t* __restrict accum) {
  if (first) {
    std::memcpy(accum, in, static_cast<size_t>(n) * sizeof(uint16_t));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    accum[i] = FloatToBf16Bits(Bf16BitsToFloat(accum[i]) + Bf16BitsToFloat(in[i]));
  }
}

SgdStepScalars MakeSgdStepScalars(double lr, double weight_decay) {
  // torch/csrc/api/src/optim/sgd.cpp: d_p.add(p, weight_decay); p.add_(d_p, -1 * lr), the
  // double Scalars converted to float by the fp32 add kernel.
  SgdStepScalars s;
  s.weight_decay = static_cast<float>(weight_decay);
  s.neg_lr = static_cast<float>(-1 * lr);
  return s;
}

MEMPLAN_VECTOR_CLONES
void SgdUpdate(const SgdStepScalars& s, float grad_scale, int64_t n, float* __restrict param,
               const float* __restrict grad) {
  const float wd = s.weight_decay, neg_lr = s.neg_lr;
  if (wd != 0) {
    for (int64_t i = 0; i < n; ++i) {
      const float d = std::fma(param[i], wd, grad[i] * grad_scale);  // d_p.add(p, wd)
      param[i] = std::fma(d, neg_lr, param[i]);                       // p.add_(d_p, -lr)
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) param[i] = std::fma(grad[i] * grad_scale, neg_lr, param[i]);
}

MEMPLAN_VECTOR_CLONES
void RoundToBf16(int64_t n, const float* __restrict in, uint16_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &in[i], sizeof(bits));
    if (std::isnan(in[i])) {
      out[i] = 0x7FC0;
      continue;
    }
    const uint32_t rounding_bias = 0x7FFF + ((bits >> 16) & 1);
    out[i] = static_cast<uint16_t>((bits + rounding_bias) >> 16);
  }
}

}  // namespace memplan
