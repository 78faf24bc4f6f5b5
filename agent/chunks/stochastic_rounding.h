// [Stochastic rounding] of an optimizer's fp32 result into bf16 parameters, for the optimizers
// that keep no fp32 master (adamw8bit). Rounding to nearest drops every update smaller than half
// a bf16 ulp of the weight (lr 3e-4 against weights of 0.02 is ~2.5 ulp: a large part of each
// update is lost, always in the same direction for a weight whose update keeps its sign); rounding
// up with probability (x - down) / (up - down) keeps the expected weight equal to the fp32 result,
// so small updates accumulate as they would on a master. Measured on qwen2.5-0.5b (200 steps of
// real text, scripts/adamw8bit-ablation.py, docs/benchmarks.md): with bf16 parameters rounded to
// nearest the loss over the last 50 steps runs 1.2-1.3 % above fp32 AdamW's, with 8-bit or fp32
// moments alike; 8-bit moments on an fp32 master stay within 0.04 %; stochastic rounding brings
// the 8-bit run within 0.26 % in every 50-step window.
//
// The noise is a pure function of (seed, parameter index, update count, element index in the
// parameter): every path (CPU kernel, LibTorch ops, fused CUDA kernel) and every placement of a
// parameter (persistent, offloaded, any chunk size or rank count) rounds an element the same
// way, and a resumed run continues bit for bit. Header-only, host and device (nvcc), no Torch.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MEMPLAN_HOST_DEVICE __host__ __device__
#else
#define MEMPLAN_HOST_DEVICE
#endif

namespace memplan {

// splitmix64's output function: a bijection of 64-bit values whose output bits all depend on
// every input bit.
MEMPLAN_HOST_DEVICE inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The key of one update of one parameter.
MEMPLAN_HOST_DEVICE inline uint64_t StochasticRoundingKey(uint64_t seed, int64_t param,
                                                          int64_t step) {
  return Mix64(Mix64(seed ^ 0x5352ull) + Mix64(static_cast<uint64_t>(param) * 0x100000001B3ull +
                                               static_cast<uint64_t>(step)));
}

// The 16 noise bits of element `index` under `key`.
MEMPLAN_HOST_DEVICE inline uint32_t RoundingNoise16(uint64_t key, uint64_t index) {
  return static_cast<uint32_t>(Mix64(key + index * 0x9E3779B97F4A7C15ull) >> 48);
}

// fp32 bits -> bf16 bits, rounded up in magnitude with probability (dropped low 16 bits) / 2^16
// given 16 uniform noise bits: bf16 is fp32's high half, so adding the noise below the cut and
// truncating does it. NaN becomes the quiet NaN 0x7FC0 (as rounding to nearest does here);
// infinities stay infinite.
MEMPLAN_HOST_DEVICE inline uint16_t Bf16BitsStochastic(uint32_t bits, uint64_t key,
                                                       uint64_t index) {
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return static_cast<uint16_t>((bits + RoundingNoise16(key, index)) >> 16);
}

// How an update writes a bf16 parameter: to nearest even, or stochastically with the key of
// (seed, parameter, step); `first` is the range's first element within its parameter.
struct ParamRounding {
  bool stochastic = false;
  uint64_t key = 0;
  int64_t first = 0;
};
// The rounding of update `step` of parameter `param` (an index in a fixed parameter order),
// elements from `first` on.
inline ParamRounding MakeParamRounding(bool stochastic, uint64_t seed, int64_t param,
                                       int64_t step, int64_t first) {
  ParamRounding r;
  r.stochastic = stochastic;
  if (stochastic) r.key = StochasticRoundingKey(seed, param, step);
  r.first = first;
  return r;
}

}  // namespace memplan
