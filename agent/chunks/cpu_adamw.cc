// Compiled with -ffp-contract=off (see CMakeLists.txt): the only fused multiply-adds are the
// explicit std::fma calls in cpu_adamw_kernels.inc, placed exactly where torch's vectorised
// kernels use vec::fmadd (add with alpha: fmadd(other, alpha, self); addcmul: the last multiply
// fused with the add; lerp). Everything else is one IEEE operation per step in torch's order, so
// vectorising these loops cannot change a single bit. -fno-math-errno lets std::sqrt vectorise.
#include "agent/chunks/cpu_adamw.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/optimizer_bytes.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// GCC on x86-64 compiles the loops once per instruction set ([Bit-exact variants] in
// cpu_adamw_kernels.inc) and picks one at run time with __builtin_cpu_supports. (target_clones
// with "arch=haswell" dispatched on __builtin_cpu_is("haswell"): every other CPU, AMD's and
// newer Intel ones included, ran the SSE2 clone with a library call per std::fma.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MEMPLAN_ISA_VARIANTS 1
#include <immintrin.h>
#else
#define MEMPLAN_ISA_VARIANTS 0
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

SgdStepScalars MakeSgdStepScalars(double lr, double weight_decay) {
  // torch/csrc/api/src/optim/sgd.cpp: d_p.add(p, weight_decay); p.add_(d_p, -1 * lr), the
  // double Scalars converted to float by the fp32 add kernel.
  SgdStepScalars s;
  s.weight_decay = static_cast<float>(weight_decay);
  s.neg_lr = static_cast<float>(-1 * lr);
  return s;
}

// bitsandbytes 0.50.2 create_dynamic_map(signed=True) and (signed=False), exactly (its float32
// arithmetic, printed as hex floats).
alignas(64) extern const float kSignedDynamicMap[256] = {
    -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f,
    -0x1.df999ap-1f, -0x1.d86666p-1f, -0x1.d13334p-1f, -0x1.cap-1f,
    -0x1.c2ccccp-1f, -0x1.bb999ap-1f, -0x1.b46666p-1f, -0x1.ad3334p-1f,
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f, -0x1.906666p-1f,
    -0x1.893334p-1f, -0x1.82p-1f, -0x1.7accccp-1f, -0x1.73999ap-1f,
    -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f,
    -0x1.4f999ap-1f, -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f,
    -0x1.32ccccp-1f, -0x1.2b999ap-1f, -0x1.246668p-1f, -0x1.1d3334p-1f,
    -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f, -0x1.006666p-1f,
    -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f,
    -0x1.b8ccccp-2f, -0x1.aa6666p-2f, -0x1.9cp-2f, -0x1.8d9998p-2f,
    -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f,
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f,
    -0x1.0cp-2f, -0x1.fb3332p-3f, -0x1.de6666p-3f, -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f,
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f,
    -0x1.93d70ap-4f, -0x1.8851eep-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f,
    -0x1.65c29p-4f, -0x1.5a3d7p-4f, -0x1.4eb854p-4f, -0x1.433334p-4f,
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f,
    -0x1.09999ap-4f, -0x1.fc28f6p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f,
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f,
    -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f, -0x1.a147aep-6f, -0x1.733334p-6f,
    -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c29p-7f,
    -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f,
    -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f,
    -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f,
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f, -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0x0p+0f,
    0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f,
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f,
    0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f,
    0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f,
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f,
    0x1.0c49bap-8f, 0x1.3126e8p-8f, 0x1.56041ap-8f, 0x1.7ae148p-8f,
    0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,
    0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f,
    0x1.d1eb86p-7f, 0x1.170a3ep-6f, 0x1.451ebap-6f, 0x1.733334p-6f,
    0x1.a147aep-6f, 0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c29p-5f,
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f,
    0x1.88f5c2p-5f, 0x1.ap-5f, 0x1.b70a3ep-5f, 0x1.ce147ap-5f,
    0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f,
    0x1.4eb854p-4f, 0x1.5a3d7p-4f, 0x1.65c29p-4f, 0x1.7147aep-4f,
    0x1.7ccccep-4f, 0x1.8851eep-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f,
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f,
    0x1.6b3334p-3f, 0x1.88p-3f, 0x1.a4ccccp-3f, 0x1.c1999ap-3f,
    0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f,
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f,
    0x1.626666p-2f, 0x1.70ccccp-2f, 0x1.7f3334p-2f, 0x1.8d9998p-2f,
    0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f,
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f,
    0x1.079998p-1f, 0x1.0eccccp-1f, 0x1.16p-1f, 0x1.1d3334p-1f,
    0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f,
    0x1.413334p-1f, 0x1.486668p-1f, 0x1.4f999ap-1f, 0x1.56ccccp-1f,
    0x1.5ep-1f, 0x1.653334p-1f, 0x1.6c6668p-1f, 0x1.73999ap-1f,
    0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
    0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f,
    0x1.b46666p-1f, 0x1.bb999ap-1f, 0x1.c2ccccp-1f, 0x1.cap-1f,
    0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df999ap-1f, 0x1.e6ccccp-1f,
    0x1.eep-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f, 0x1p+0f,
};
alignas(64) extern const float kUnsignedDynamicMap[256] = {
    0x0p+0f, 0x1.5cf754p-22f, 0x1.a0133p-21f, 0x1.1d367p-19f,
    0x1.2599ecp-18f, 0x1.bc98a2p-18f, 0x1.29cbaap-17f, 0x1.0624dcp-16f,
    0x1.c2e34p-16f, 0x1.3fd0dp-15f, 0x1.9e3p-15f, 0x1.fc8f34p-15f,
    0x1.2d7732p-14f, 0x1.5ca6c8p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f,
    0x1.82a994p-13f, 0x1.f8a092p-13f, 0x1.374bc8p-12f, 0x1.724744p-12f,
    0x1.ad42c6p-12f, 0x1.e83e44p-12f, 0x1.119ce2p-11f, 0x1.2f1aap-11f,
    0x1.4c986p-11f, 0x1.6a162p-11f, 0x1.8793dep-11f, 0x1.a511ap-11f,
    0x1.c28f5ep-11f, 0x1.e00d1cp-11f, 0x1.fd8adcp-11f, 0x1.2b020cp-10f,
    0x1.74bc6ap-10f, 0x1.be76c8p-10f, 0x1.041894p-9f, 0x1.28f5c2p-9f,
    0x1.4dd2fp-9f, 0x1.72b02p-9f, 0x1.978d4ep-9f, 0x1.bc6a8p-9f,
    0x1.e147aep-9f, 0x1.03126ep-8f, 0x1.158104p-8f, 0x1.27ef9ep-8f,
    0x1.3a5e34p-8f, 0x1.4cccccp-8f, 0x1.5f3b64p-8f, 0x1.71a9fap-8f,
    0x1.841894p-8f, 0x1.96872ap-8f, 0x1.a8f5c2p-8f, 0x1.bb645cp-8f,
    0x1.cdd2fp-8f, 0x1.e0418ap-8f, 0x1.f2b01ep-8f, 0x1.028f5cp-7f,
    0x1.0bc6a8p-7f, 0x1.14fdf2p-7f, 0x1.1e354p-7f, 0x1.276c8ap-7f,
    0x1.30a3d6p-7f, 0x1.39db24p-7f, 0x1.43126ep-7f, 0x1.5eb854p-7f,
    0x1.8ccccep-7f, 0x1.bae146p-7f, 0x1.e8f5c4p-7f, 0x1.0b851ep-6f,
    0x1.228f5ep-6f, 0x1.39999ap-6f, 0x1.50a3d6p-6f, 0x1.67ae16p-6f,
    0x1.7eb852p-6f, 0x1.95c28ep-6f, 0x1.accccep-6f, 0x1.c3d70ep-6f,
    0x1.dae146p-6f, 0x1.f1eb86p-6f, 0x1.047aep-5f, 0x1.1p-5f,
    0x1.1b851ep-5f, 0x1.270a3ep-5f, 0x1.328f5ep-5f, 0x1.3e147ap-5f,
    0x1.49999ap-5f, 0x1.551eb8p-5f, 0x1.60a3d6p-5f, 0x1.6c28f6p-5f,
    0x1.77ae14p-5f, 0x1.833334p-5f, 0x1.8eb85p-5f, 0x1.9a3d7p-5f,
    0x1.a5c28ep-5f, 0x1.b147aep-5f, 0x1.bccccep-5f, 0x1.c851eep-5f,
    0x1.d3d70ep-5f, 0x1.df5c2ap-5f, 0x1.eae146p-5f, 0x1.f66666p-5f,
    0x1.00f5c4p-4f, 0x1.06b854p-4f, 0x1.0c7ae2p-4f, 0x1.123d7p-4f,
    0x1.18p-4f, 0x1.1dc29p-4f, 0x1.23852p-4f, 0x1.2947aep-4f,
    0x1.2f0a3ep-4f, 0x1.34cccep-4f, 0x1.3a8f5ep-4f, 0x1.4051ecp-4f,
    0x1.46147cp-4f, 0x1.4bd70ap-4f, 0x1.51999ap-4f, 0x1.575c2ap-4f,
    0x1.5d1eb8p-4f, 0x1.62e148p-4f, 0x1.68a3d6p-4f, 0x1.6e6666p-4f,
    0x1.7428f6p-4f, 0x1.79eb86p-4f, 0x1.7fae16p-4f, 0x1.8570a4p-4f,
    0x1.8b3334p-4f, 0x1.90f5c4p-4f, 0x1.96b852p-4f, 0x1.a8p-4f,
    0x1.c4ccccp-4f, 0x1.e1999ap-4f, 0x1.fe6666p-4f, 0x1.0d9998p-3f,
    0x1.1cp-3f, 0x1.2a6668p-3f, 0x1.38ccccp-3f, 0x1.473334p-3f,
    0x1.559998p-3f, 0x1.64p-3f, 0x1.726668p-3f, 0x1.80ccccp-3f,
    0x1.8f3334p-3f, 0x1.9d9998p-3f, 0x1.acp-3f, 0x1.ba6668p-3f,
    0x1.c8ccccp-3f, 0x1.d73334p-3f, 0x1.e59998p-3f, 0x1.f4p-3f,
    0x1.013332p-2f, 0x1.086666p-2f, 0x1.0f999ap-2f, 0x1.16ccccp-2f,
    0x1.1ep-2f, 0x1.253334p-2f, 0x1.2c6666p-2f, 0x1.339998p-2f,
    0x1.3accccp-2f, 0x1.42p-2f, 0x1.493334p-2f, 0x1.506666p-2f,
    0x1.579998p-2f, 0x1.5eccccp-2f, 0x1.66p-2f, 0x1.6d3334p-2f,
    0x1.746666p-2f, 0x1.7b9998p-2f, 0x1.82ccccp-2f, 0x1.8ap-2f,
    0x1.913334p-2f, 0x1.986666p-2f, 0x1.9f9998p-2f, 0x1.a6ccccp-2f,
    0x1.aep-2f, 0x1.b53334p-2f, 0x1.bc6666p-2f, 0x1.c39998p-2f,
    0x1.caccccp-2f, 0x1.d2p-2f, 0x1.d93334p-2f, 0x1.e06666p-2f,
    0x1.e79998p-2f, 0x1.eeccccp-2f, 0x1.f6p-2f, 0x1.fd3332p-2f,
    0x1.023334p-1f, 0x1.05ccccp-1f, 0x1.096666p-1f, 0x1.0dp-1f,
    0x1.109998p-1f, 0x1.143334p-1f, 0x1.17ccccp-1f, 0x1.1b6668p-1f,
    0x1.1fp-1f, 0x1.22999ap-1f, 0x1.263334p-1f, 0x1.29ccccp-1f,
    0x1.2d6668p-1f, 0x1.31p-1f, 0x1.34999ap-1f, 0x1.383334p-1f,
    0x1.3bccccp-1f, 0x1.3f6668p-1f, 0x1.43p-1f, 0x1.46999ap-1f,
    0x1.4a3334p-1f, 0x1.4dccccp-1f, 0x1.516668p-1f, 0x1.55p-1f,
    0x1.58999ap-1f, 0x1.5c3334p-1f, 0x1.5fccccp-1f, 0x1.636668p-1f,
    0x1.67p-1f, 0x1.6a999ap-1f, 0x1.6e3334p-1f, 0x1.71ccccp-1f,
    0x1.756668p-1f, 0x1.79p-1f, 0x1.7c999ap-1f, 0x1.803334p-1f,
    0x1.83ccccp-1f, 0x1.876668p-1f, 0x1.8bp-1f, 0x1.8e9998p-1f,
    0x1.923334p-1f, 0x1.95ccccp-1f, 0x1.996668p-1f, 0x1.9dp-1f,
    0x1.a09998p-1f, 0x1.a43334p-1f, 0x1.a7ccccp-1f, 0x1.ab6668p-1f,
    0x1.afp-1f, 0x1.b29998p-1f, 0x1.b63334p-1f, 0x1.b9ccccp-1f,
    0x1.bd6668p-1f, 0x1.c1p-1f, 0x1.c49998p-1f, 0x1.c83334p-1f,
    0x1.cbccccp-1f, 0x1.cf6668p-1f, 0x1.d3p-1f, 0x1.d69998p-1f,
    0x1.da3334p-1f, 0x1.ddccccp-1f, 0x1.e16668p-1f, 0x1.e5p-1f,
    0x1.e89998p-1f, 0x1.ec3334p-1f, 0x1.efccccp-1f, 0x1.f36668p-1f,
    0x1.f7p-1f, 0x1.fa9998p-1f, 0x1.fe3334p-1f, 0x1p+0f,
};

namespace {

inline uint16_t FloatToBf16Bits(float value) {
  if (std::isnan(value)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t rounding_bias = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

// The midpoints between consecutive entries, (map[i] + map[i + 1]) / 2 in fp32, and +inf last so
// that a branch-free binary search sees 256 entries.
struct Midpoints {
  alignas(64) float at[256];
  explicit Midpoints(const float* map) {
    for (int i = 0; i < 255; ++i) at[i] = (map[i] + map[i + 1]) / 2;
    at[255] = std::numeric_limits<float>::infinity();
  }
};

const float* MidpointsOf(const float* map) {
  static const Midpoints kSigned(kSignedDynamicMap), kUnsigned(kUnsignedDynamicMap);
  return map == kSignedDynamicMap ? kSigned.at : kUnsigned.at;
}

// The number of midpoints below x: the nearest entry, a value on a midpoint going to the lower
// one (torch.bucketize(x, midpoints), bitsandbytes' default backend). Eight branch-free halvings
// (the +inf sentinel is never below x; NaN is below nothing: code 0).
inline uint8_t NearestCode(const float* mids, float x) {
  int idx = 0;
  for (int half = 128; half > 0; half >>= 1) idx += mids[idx + half - 1] < x ? half : 0;
  return static_cast<uint8_t>(idx);
}

// [Code table] The fast code search. A float's top 16 bits (sign, exponent, 7 mantissa bits) name
// a bucket; every |x| below 2^-24 shares bucket 0 and every |x| >= 1 (infinities too) the top
// one. No bucket of either map holds two midpoints (the narrowest spacing, near 1 in the unsigned
// map, is wider than 2^-8), and the two clamped buckets hold none, so a bucket's entry says all:
// lo, the code of its lowest value, and the low 16 bits of the midpoint inside it, if any. Within
// a bucket a value is above that midpoint iff its low 16 bits are (for negative values: below),
// so a value's code is lo + (low16 > threshold), with the low 16 bits of a negative value flipped
// and threshold 0xFFFF where the bucket holds no midpoint: one table read and one integer
// compare, vectorisable as one gather. NaN gets 0, as NearestCode gives it. The table is built
// from NearestCode itself and the constructor checks the one-midpoint property; the tests compare
// the result with NearestCode on every float class (adamw8bit_test).
constexpr int kCodeShift = 16;                       // 23 - 7 mantissa bits
constexpr int32_t kCodeLowBucket = (127 - 24) << 7;  // 2^-24
constexpr int32_t kCodeTopBucket = (127 << 7) - kCodeLowBucket;  // 1.0 and above
constexpr int32_t kCodeBuckets = kCodeTopBucket + 1;            // per sign
constexpr uint32_t kNoMidpoint = 0xFFFF;

struct CodeTable {
  // Positive buckets, then negative ones: lo << 16 | threshold.
  alignas(64) uint32_t entry[2 * kCodeBuckets] = {};
  explicit CodeTable(const float* map) {
    const float* mids = MidpointsOf(map);
    auto from_bits = [](uint32_t bits) {
      float x;
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    };
    for (int32_t k = 0; k < kCodeBuckets; ++k) {
      const uint32_t first = k == 0 ? 0u : static_cast<uint32_t>(kCodeLowBucket + k) << kCodeShift;
      const uint32_t last = k == kCodeTopBucket
                                ? 0x7F800000u
                                : (static_cast<uint32_t>(kCodeLowBucket + k + 1) << kCodeShift) - 1;
      for (const bool negative : {false, true}) {
        // NearestCode is monotone: a bucket's codes run from that of its lowest value to that of
        // its highest.
        const float low = negative ? -from_bits(last) : from_bits(first);
        const float high = negative ? -from_bits(first) : from_bits(last);
        const int lo_code = NearestCode(mids, low), hi_code = NearestCode(mids, high);
        uint32_t threshold = kNoMidpoint;
        if (hi_code - lo_code == 1 && k != 0 && k != kCodeTopBucket) {
          // mids[lo_code] is the one midpoint in [low, high): its top 16 bits are the bucket's.
          uint32_t mid_bits;
          std::memcpy(&mid_bits, &mids[lo_code], sizeof(mid_bits));
          const uint32_t bucket_bits = (negative ? 0x80000000u : 0u) | first;
          if ((mid_bits >> kCodeShift) != (bucket_bits >> kCodeShift)) std::abort();
          threshold = negative ? 0xFFFFu - (mid_bits & 0xFFFFu) : mid_bits & 0xFFFFu;
        } else if (hi_code != lo_code) {
          std::fprintf(stderr, "cpu_adamw: code table bucket %d holds %d midpoints\n", k,
                       hi_code - lo_code);
          std::abort();
        }
        entry[k + (negative ? kCodeBuckets : 0)] =
            static_cast<uint32_t>(lo_code) << 16 | threshold;
      }
    }
  }
};

const CodeTable& SignedCodeTable() {
  static const CodeTable table(kSignedDynamicMap);
  return table;
}
const CodeTable& UnsignedCodeTable() {
  static const CodeTable table(kUnsignedDynamicMap);
  return table;
}

namespace portable {
#define MEMPLAN_ISA_LEVEL 0
#include "agent/chunks/cpu_adamw_kernels.inc"
#undef MEMPLAN_ISA_LEVEL
}  // namespace portable

#if MEMPLAN_ISA_VARIANTS
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
namespace avx2 {
#define MEMPLAN_ISA_LEVEL 2
#include "agent/chunks/cpu_adamw_kernels.inc"
#undef MEMPLAN_ISA_LEVEL
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
// GCC 12's own avx512fintrin.h trips -W(maybe-)uninitialized on its _mm512_undefined_* operands.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c,bmi,bmi2")
namespace avx512 {
#define MEMPLAN_ISA_LEVEL 3
#include "agent/chunks/cpu_adamw_kernels.inc"
#undef MEMPLAN_ISA_LEVEL
}  // namespace avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

const CpuKernels& BestKernels() {
  static const CpuKernels& kernels = KernelsFor(BestCpuIsa());
  return kernels;
}

}  // namespace

bool CpuIsaSupported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable:
      return true;
#if MEMPLAN_ISA_VARIANTS
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi2");
    case CpuIsa::kAvx512:
      return CpuIsaSupported(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#else
    default:
      return false;
#endif
  }
  return false;
}

CpuIsa BestCpuIsa() {
  static const CpuIsa best = CpuIsaSupported(CpuIsa::kAvx512) ? CpuIsa::kAvx512
                             : CpuIsaSupported(CpuIsa::kAvx2) ? CpuIsa::kAvx2
                                                              : CpuIsa::kPortable;
  return best;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    default:
      return "portable";
  }
}

const CpuKernels& KernelsFor(CpuIsa isa) {
#if MEMPLAN_ISA_VARIANTS
  if (isa == CpuIsa::kAvx512) return avx512::kKernels;
  if (isa == CpuIsa::kAvx2) return avx2::kKernels;
#endif
  (void)isa;
  return portable::kKernels;
}

void AdamWUpdate(const AdamWStepScalars& s, float grad_scale, int64_t n, float* param,
                 const float* grad, float* exp_avg, float* exp_avg_sq, VectorSqrtFn sqrt_fn) {
  BestKernels().adamw(s, grad_scale, n, param, grad, exp_avg, exp_avg_sq, sqrt_fn);
}

void AdamWBf16Update(const AdamWStepScalars& s, float grad_scale, int64_t n, uint16_t* param,
                     const uint16_t* grad, uint16_t* exp_avg, uint16_t* exp_avg_sq,
                     int64_t torch_vector_elems) {
  BestKernels().adamw_bf16(s, grad_scale, n, param, grad, exp_avg, exp_avg_sq,
                           torch_vector_elems);
}

void AdamWBf16ParamPass(const AdamWStepScalars& s, float grad_scale, int64_t n, uint16_t* param,
                        const uint16_t* grad, const uint16_t* exp_avg,
                        const uint16_t* exp_avg_sq, int64_t torch_vector_elems) {
  // The kernel's moment pointers are not written through (kMoments false).
  BestKernels().adamw_bf16_params(s, grad_scale, n, param, grad, const_cast<uint16_t*>(exp_avg),
                                  const_cast<uint16_t*>(exp_avg_sq), torch_vector_elems);
}

void AccumulateGrad(bool first, int64_t n, const float* in, float* accum) {
  BestKernels().accumulate(first, n, in, accum);
}

void AccumulateGradBf16(bool first, int64_t n, const uint16_t* in, float* accum) {
  BestKernels().accumulate_bf16(first, n, in, accum);
}

void AccumulateGradBf16Rounded(bool first, int64_t n, const uint16_t* in, uint16_t* accum) {
  BestKernels().accumulate_bf16_rounded(first, n, in, accum);
}

void SgdUpdate(const SgdStepScalars& s, float grad_scale, int64_t n, float* param,
               const float* grad) {
  BestKernels().sgd(s, grad_scale, n, param, grad);
}

#if MEMPLAN_ISA_VARIANTS
namespace {
// Whole 64-byte lines, one streaming store each (the 16-byte stores below fill a line in four).
__attribute__((target("avx512f"))) void CopyBypassingCache512(char* d, const char* from,
                                                              int64_t bytes) {
  const int64_t head = std::min<int64_t>(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, from, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(from + i));
  }
  std::memcpy(d + i, from + i, static_cast<size_t>(bytes - i));
}
}  // namespace
#endif

void CopyBypassingCache(void* dst, const void* src, int64_t bytes) {
#if MEMPLAN_ISA_VARIANTS
  static const bool kAvx512 = __builtin_cpu_supports("avx512f");
  if (kAvx512) {
    CopyBypassingCache512(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
    return;
  }
#endif
#if defined(__SSE2__)
  char* d = static_cast<char*>(dst);
  const char* from = static_cast<const char*>(src);
  // Up to the destination's first 16-byte boundary by memcpy, then 16-byte streaming stores.
  const int64_t head = std::min<int64_t>(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, from, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
  }
  std::memcpy(d + i, from + i, static_cast<size_t>(bytes - i));
#else
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
}

void CopyBypassingCacheFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

void RoundToBf16(int64_t n, const float* in, uint16_t* out) {
  BestKernels().round_to_bf16(n, in, out);
}

void RoundToBf16(const ParamRounding& rounding, int64_t n, const float* in, uint16_t* out) {
  BestKernels().round_to_bf16_rounding(rounding, n, in, out);
}

uint8_t NearestCode8bit(const float* map, float normed) {
  return NearestCode(MidpointsOf(map), normed);
}

float QuantizeBlock8bit(const float* map, int64_t n, const float* in, uint8_t* codes) {
  return BestKernels().quantize_block(map, n, in, codes);
}

void DequantizeBlock8bit(const float* map, float absmax, int64_t n, const uint8_t* codes,
                         float* out) {
  BestKernels().dequantize_block(map, absmax, n, codes, out);
}

void AdamW8bitUpdate(const AdamWStepScalars& s, float grad_scale, int64_t n,
                     const QuantBlocks& blocks, float* param, const float* grad,
                     uint8_t* exp_avg, uint8_t* exp_avg_sq, float* exp_avg_absmax,
                     float* exp_avg_sq_absmax, VectorSqrtFn sqrt_fn) {
  BestKernels().adamw8bit(s, grad_scale, n, blocks, param, grad, exp_avg, exp_avg_sq,
                          exp_avg_absmax, exp_avg_sq_absmax, sqrt_fn);
}

void AdamW8bitUpdateBf16(const AdamWStepScalars& s, float grad_scale, int64_t n,
                         const QuantBlocks& blocks, uint16_t* param, const uint16_t* grad,
                         uint8_t* exp_avg, uint8_t* exp_avg_sq, float* exp_avg_absmax,
                         float* exp_avg_sq_absmax, VectorSqrtFn sqrt_fn,
                         const ParamRounding& rounding) {
  BestKernels().adamw8bit_bf16(s, grad_scale, n, blocks, param, grad, exp_avg, exp_avg_sq,
                               exp_avg_absmax, exp_avg_sq_absmax, sqrt_fn, rounding);
}

}  // namespace memplan
