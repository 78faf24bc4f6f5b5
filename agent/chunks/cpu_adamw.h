// CPU AdamW and SGD kernels on fp32 arrays, bit-identical to torch::optim::AdamW / SGD on CPU
// (torch 2.11, AVX2/AVX-512 kernels) for fp32 tensors, bf16 AdamW as torch's fused kernel, 8-bit
// AdamW, plus gradient accumulation and bf16 rounding helpers. Each is compiled for several
// instruction sets (CpuIsa) and runs the best one the CPU supports; all give the same bits.
// Torch-free; pure functions, thread-safe on disjoint ranges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "agent/chunks/stochastic_rounding.h"

namespace memplan {

// Hyper-parameters of torch::optim::AdamW (decoupled weight decay, no amsgrad).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// The per-step constants, rounded to fp32 the way torch's CPU kernels round Scalar arguments.
struct AdamWStepScalars {
  float weight_decay_factor = 1.0f;  // 1 - lr * weight_decay (1 when weight_decay == 0)
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float bias_correction2_sqrt = 1.0f;
  float eps = 0;
  float neg_step_size = 0;  // -lr / (1 - beta1^step)
};

// `step` is the 1-based step count after this update (torch increments before computing).
AdamWStepScalars MakeAdamWStepScalars(const AdamWOptions& options, int64_t step);

// out[i] = sqrt(in[i]) for n <= kSqrtBlockElems elements. torch's CPU sqrt for fp32 (MKL VML on
// x86 builds) is not correctly rounded, so bit-exactness needs torch's own kernel: the Torch side
// passes one (agent/chunks/torch_sqrt.h); nullptr = std::sqrt (correctly rounded).
using VectorSqrtFn = void (*)(const float* in, float* out, int64_t n);
// Matches torch's grain size for its VML unary kernels: a block never goes multi-threaded.
inline constexpr int64_t kSqrtBlockElems = 2048;

// One AdamW update of n elements in place. The gradient is first multiplied by grad_scale
// (the clip coefficient; 1.0f is exact, so clipping off costs nothing in accuracy).
void AdamWUpdate(const AdamWStepScalars& s, float grad_scale, int64_t n, float* param,
                 const float* grad, float* exp_avg, float* exp_avg_sq,
                 VectorSqrtFn sqrt_fn = nullptr);

// One AdamW update of n bf16 elements (raw bits) in place, no master: at::_fused_adamw_ on bf16
// CPU tensors (torch.optim.AdamW(fused=True)) under torch's AVX2 or AVX-512 dispatch, preceded
// when grad_scale != 1 by clip_grad_norm_'s bf16 grad.mul_(coef) (the grad array itself is not
// written). Bit-identical to torch for non-NaN results; a NaN result is stored as 0x7FC0.
// torch_vector_elems is Vectorized<BFloat16>::size() of the kernel torch dispatches to (16 for
// AVX2, 32 for AVX-512): torch's scalar loop over the last n % torch_vector_elems elements rounds
// exp_avg_sq's update differently from its vector loop.
void AdamWBf16Update(const AdamWStepScalars& s, float grad_scale, int64_t n, uint16_t* param,
                     const uint16_t* grad, uint16_t* exp_avg, uint16_t* exp_avg_sq,
                     int64_t torch_vector_elems);

// AdamWBf16Update's parameter results alone, bit for bit; the moments are read and left as they
// were. For memplan-cpu-adam-bench: the memory traffic of a clipped step's critical pass if the
// moments were written later (the parameters are what the next forward waits for).
void AdamWBf16ParamPass(const AdamWStepScalars& s, float grad_scale, int64_t n, uint16_t* param,
                        const uint16_t* grad, const uint16_t* exp_avg,
                        const uint16_t* exp_avg_sq, int64_t torch_vector_elems);

// accum[i] = first ? in[i] : accum[i] + in[i]  (autograd's accumulation order).
void AccumulateGrad(bool first, int64_t n, const float* in, float* accum);
// Same for a bf16 input (raw bits), widened exactly to fp32.
void AccumulateGradBf16(bool first, int64_t n, const uint16_t* in, float* accum);

// accum[i] = first ? in[i] : bf16(accum[i] + in[i]) on bf16 bits: torch's accumulation of a
// bf16 .grad (each sum computed in fp32 and rounded to nearest even).
void AccumulateGradBf16Rounded(bool first, int64_t n, const uint16_t* in, uint16_t* accum);

// memcpy with non-temporal stores where the CPU has them (x86-64: SSE2): the destination's lines
// are neither read first nor kept in cache. Another thread may read `dst` only after
// CopyBypassingCacheFence() on this one (and whatever hands the work over).
void CopyBypassingCache(void* dst, const void* src, int64_t bytes);
void CopyBypassingCacheFence();

// adamw8bit: the absmax slot of the first block that starts at or after element `begin`, with
// `slot` elements a slot (common/optimizer_bytes.h QuantSlotElems).
constexpr int64_t FirstSlot(int64_t begin, int64_t slot) { return (begin + slot - 1) / slot; }

// [Speculative clipped updates] (agent/chunks/README.md) An update that reads one copy of its
// arrays and writes another: for each array the update writes, the one it reads (`live`), the
// one it writes (`copy`), per element, or per absmax slot (`slots`).
struct TileArray {
  char* live;
  char* copy;
  int64_t elem_bytes;
  bool slots;
};
// Elements of one piece of such an update: a multiple of adamw8bit's 256-element blocks, small
// enough that the piece of every array stays in a core's L2 cache from the copy in to the copy
// out (fp32-master adamw: 384 KiB), large enough to amortise the pass's three phases
// (memplan-cpu-adam-bench's adamw_bf16_into_copies on 2 EPYC cores: 2.1 ns a parameter with
// 2 048-element pieces, 1.8 with 8 192, 1.5 with 32 768 and with 131 072; 1.0 in place).
inline constexpr int64_t kCopyPieceElems = int64_t{1} << 15;

// Runs update(piece_begin, piece_len, tile) over elements [begin, begin + len) in pieces of
// kCopyPieceElems, each array's part of the piece first copied from `live` into this thread's
// tile (tile[k] for tiled[k], 64-byte aligned), updated there in place by the callback, then
// written to `copy` with streaming stores: the same memory traffic as the update in place.
// A piece's slots are those of the blocks that start in it, [FirstSlot(b), FirstSlot(b + n)):
// disjoint between pieces that start on block boundaries.
template <typename Update>
void UpdateIntoCopies(int64_t begin, int64_t len, const std::vector<TileArray>& tiled, int64_t slot,
                      const Update& update) {
  constexpr int64_t kAlign = 64;
  thread_local std::vector<char> storage;
  std::vector<int64_t> offsets;
  int64_t bytes = 0;
  for (const TileArray& a : tiled) {
    offsets.push_back(bytes);
    const int64_t n = a.slots ? kCopyPieceElems / slot + 2 : kCopyPieceElems;
    bytes += (n * a.elem_bytes + kAlign - 1) / kAlign * kAlign;
  }
  if (static_cast<int64_t>(storage.size()) < bytes + kAlign) {
    storage.resize(static_cast<size_t>(bytes + kAlign));
  }
  char* base = storage.data() + (kAlign - reinterpret_cast<uintptr_t>(storage.data()) % kAlign);
  std::vector<char*> tile;
  for (int64_t off : offsets) tile.push_back(base + off);
  for (int64_t off = 0; off < len; off += kCopyPieceElems) {
    const int64_t b = begin + off, n = std::min(kCopyPieceElems, len - off);
    auto extent = [&](const TileArray& a) {
      if (!a.slots) return std::pair<int64_t, int64_t>(b, n);
      return std::pair<int64_t, int64_t>(FirstSlot(b, slot),
                                         FirstSlot(b + n, slot) - FirstSlot(b, slot));
    };
    for (size_t k = 0; k < tiled.size(); ++k) {
      const auto [at, count] = extent(tiled[k]);
      std::memcpy(tile[k], tiled[k].live + at * tiled[k].elem_bytes,
                  static_cast<size_t>(count * tiled[k].elem_bytes));
    }
    update(b, n, tile.data());
    for (size_t k = 0; k < tiled.size(); ++k) {
      const auto [at, count] = extent(tiled[k]);
      CopyBypassingCache(tiled[k].copy + at * tiled[k].elem_bytes, tile[k],
                         count * tiled[k].elem_bytes);
    }
  }
  CopyBypassingCacheFence();
}

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN), like c10::BFloat16.
void RoundToBf16(int64_t n, const float* in, uint16_t* out);
// bf16 bits -> the fp32 value they stand for (exact: bf16 is fp32's high half).
inline float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// torch::optim::SGD without momentum: d = grad (+ weight_decay * param); param -= lr * d. The
// scalars as torch's fp32 kernels receive them.
struct SgdStepScalars {
  float weight_decay = 0;  // 0: no decay term (torch skips the add)
  float neg_lr = 0;        // -lr
};
SgdStepScalars MakeSgdStepScalars(double lr, double weight_decay);

// One SGD update of n fp32 elements in place; the gradient is first multiplied by grad_scale (the
// clip coefficient) and is not modified.
void SgdUpdate(const SgdStepScalars& s, float grad_scale, int64_t n, float* param,
               const float* grad);

// 8-bit AdamW as bitsandbytes' AdamW8bit defines it (optimizer_update_8bit_blockwise, "adam"):
// per block of <= 256 elements (common/optimizer_bytes.h, [8-bit optimizer state]) the uint8
// codes are dequantized (map[code] * absmax, fp32), the fp32 AdamW update runs (AdamWUpdate's
// operations, the order of bitsandbytes' CPU backend), and both moments are quantized again with
// the block's new absmax (max |x|; code = the number of midpoints between consecutive map
// entries below x * (1 / absmax): the nearest entry, ties to the lower one, as bitsandbytes'
// default backend scales and buckets; an all-zero block keeps absmax 0).
// The maps are bitsandbytes' create_dynamic_map(signed=True) for exp_avg and (signed=False) for
// exp_avg_sq. bitsandbytes' native CPU quantizer (libbitsandbytes_cpu) differs: it divides, and
// its approximate binary search sends values below about 1e-5 of the absmax to the +-2.1e-5
// entries instead of the nearest one (tests/parity/adamw8bit_parity_test.py measures both).
extern const float kSignedDynamicMap[256];
extern const float kUnsignedDynamicMap[256];

// The code of a value already divided by its block's absmax (in [-1, 1]): the nearest entry of
// `map` (kSignedDynamicMap or kUnsignedDynamicMap), ties to the lower code.
uint8_t NearestCode8bit(const float* map, float normed);
// Quantizes n (1..256) values as one block; returns the absmax.
float QuantizeBlock8bit(const float* map, int64_t n, const float* in, uint8_t* codes);
// out[i] = map[codes[i]] * absmax.
void DequantizeBlock8bit(const float* map, float absmax, int64_t n, const uint8_t* codes,
                         float* out);

// Where the absmax of each block of a range lives: block 0 (first_block_elems <= 256 elements,
// the rest of a parameter block) at index 0, block b >= 1 (256 elements, the last one possibly
// shorter) at first_slot_gap + (b - 1) * slot_stride of the absmax arrays.
struct QuantBlocks {
  int64_t first_block_elems = 256;
  int64_t first_slot_gap = 1;
  int64_t slot_stride = 1;
};

// 8-bit AdamW update of n elements in place: fp32 parameters and grads. The grad is multiplied by
// grad_scale first (the clip coefficient), as in AdamWUpdate.
void AdamW8bitUpdate(const AdamWStepScalars& s, float grad_scale, int64_t n,
                     const QuantBlocks& blocks, float* param, const float* grad,
                     uint8_t* exp_avg, uint8_t* exp_avg_sq, float* exp_avg_absmax,
                     float* exp_avg_sq_absmax, VectorSqrtFn sqrt_fn = nullptr);
// The same for bf16 parameters and grads (raw bits), without a master: the grad is widened
// (grad_scale != 1: the product rounded to bf16 first, as clip_grad_norm_ scales a bf16 grad),
// the update runs in fp32 and the parameter is rounded back to bf16 as `rounding` says (nearest
// even by default, as bitsandbytes does; [Stochastic rounding] in stochastic_rounding.h).
void AdamW8bitUpdateBf16(const AdamWStepScalars& s, float grad_scale, int64_t n,
                         const QuantBlocks& blocks, uint16_t* param, const uint16_t* grad,
                         uint8_t* exp_avg, uint8_t* exp_avg_sq, float* exp_avg_absmax,
                         float* exp_avg_sq_absmax, VectorSqrtFn sqrt_fn = nullptr,
                         const ParamRounding& rounding = {});

// n fp32 values into bf16 bits: nearest even, or stochastically for elements rounding.first ..
// rounding.first + n - 1 of the parameter.
void RoundToBf16(const ParamRounding& rounding, int64_t n, const float* in, uint16_t* out);

// The instruction sets the kernels are compiled for (GCC on x86-64; elsewhere only kPortable).
enum class CpuIsa { kPortable, kAvx2, kAvx512 };
bool CpuIsaSupported(CpuIsa isa);
// The one every kernel above runs: the widest supported, chosen at first use.
CpuIsa BestCpuIsa();
const char* CpuIsaName(CpuIsa isa);  // "portable", "avx2", "avx512"

// The kernels of one instruction set, for tests and benchmarks that compare the variants.
struct CpuKernels {
  void (*adamw)(const AdamWStepScalars&, float, int64_t, float*, const float*, float*, float*,
                VectorSqrtFn);
  void (*adamw_bf16)(const AdamWStepScalars&, float, int64_t, uint16_t*, const uint16_t*,
                     uint16_t*, uint16_t*, int64_t);
  void (*sgd)(const SgdStepScalars&, float, int64_t, float*, const float*);
  void (*accumulate)(bool, int64_t, const float*, float*);
  void (*accumulate_bf16)(bool, int64_t, const uint16_t*, float*);
  void (*accumulate_bf16_rounded)(bool, int64_t, const uint16_t*, uint16_t*);
  void (*round_to_bf16)(int64_t, const float*, uint16_t*);
  void (*round_to_bf16_rounding)(const ParamRounding&, int64_t, const float*, uint16_t*);
  void (*adamw8bit)(const AdamWStepScalars&, float, int64_t, const QuantBlocks&, float*,
                    const float*, uint8_t*, uint8_t*, float*, float*, VectorSqrtFn);
  void (*adamw8bit_bf16)(const AdamWStepScalars&, float, int64_t, const QuantBlocks&, uint16_t*,
                         const uint16_t*, uint8_t*, uint8_t*, float*, float*, VectorSqrtFn,
                         const ParamRounding&);
  float (*quantize_block)(const float* map, int64_t n, const float* in, uint8_t* codes);
  // codes[i] = NearestCode8bit(map, normed[i]) for any float (no scaling, no clamp).
  void (*nearest_codes)(const float* map, int64_t n, const float* normed, uint8_t* codes);
  void (*dequantize_block)(const float* map, float absmax, int64_t n, const uint8_t* codes,
                           float* out);
  void (*adamw_bf16_params)(const AdamWStepScalars&, float, int64_t, uint16_t*, const uint16_t*,
                            uint16_t*, uint16_t*, int64_t);
};
// CpuIsaSupported(isa) must hold.
const CpuKernels& KernelsFor(CpuIsa isa);

}  // namespace memplan
