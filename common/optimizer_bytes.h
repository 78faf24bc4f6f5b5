// What each optimizer holds and moves per parameter element: the one definition that the agent's
// ChunkManager allocates by (agent/chunks) and the planner's cost model charges (planner/cost).
// Header-only, torch- and proto-free; pure functions.
//
//   adamw       torch AdamW with mixed precision: fp32 exp_avg + exp_avg_sq, and an fp32 master
//               when the parameters are narrower than fp32 (the update runs on the master).
//   adamw_bf16  pure low-precision AdamW (torch.optim.AdamW(fused=True) on bf16 parameters):
//               exp_avg + exp_avg_sq in the parameter dtype, no master; requires bf16 parameters.
//   sgd         torch SGD (no momentum): no state; an fp32 master when the parameters are narrower.
//   adamw8bit   bitsandbytes' AdamW8bit: exp_avg / exp_avg_sq as uint8 codes of the dynamic maps
//               with one fp32 absmax per 256-element block of each parameter per moment
//               ([8-bit optimizer state]); no master: the update runs in fp32 and is rounded into
//               the parameter dtype, as bitsandbytes does.
//
// [8-bit optimizer state]
// Blocks are bitsandbytes' per tensor: elements [256 k, 256 (k + 1)) of each parameter (the last
// one partial), whatever the chunk layout, so the numerics do not depend on the chunking. Every
// tensor is quantized, small ones included (bitsandbytes' min_8bit_size = 0): the bytes then stay
// a function of the chunk size alone. Absmax values are stored per chunk (or rank's shard) in
// slots, one per 256 bytes of parameters: a parameter starts at a multiple of the 256-byte
// alignment, so block starts fall on distinct slots (ceil((start - shard start) / slot elems));
// with world size W > 1 a block cut by a shard boundary is two blocks, one per rank, each with its
// absmax (what makes W ranks differ from one, only in those blocks).
#pragma once

#include <cstdint>

#include "common/types.h"

namespace memplan {

// The update runs on an fp32 master copy (parameters narrower than fp32, adamw and sgd).
constexpr bool OptimizerKeepsMaster(OptimizerKind kind, int64_t dtype_bytes) {
  return kind != OptimizerKind::kAdamWBf16States && kind != OptimizerKind::kAdamW8bit &&
         dtype_bytes != 4;
}

// [8-bit optimizer state] constants.
inline constexpr int64_t kQuantBlockElems = 256;  // elements per absmax block of a parameter
// Absmax blocks of a parameter of `elems` elements (the last one partial).
constexpr int64_t QuantBlockCount(int64_t elems) {
  return (elems + kQuantBlockElems - 1) / kQuantBlockElems;
}
inline constexpr int64_t kQuantSlotBytes = 256;   // parameter bytes per absmax slot; also the
                                                  // chunk alignment adamw8bit requires
constexpr int64_t QuantSlotElems(int64_t dtype_bytes) { return kQuantSlotBytes / dtype_bytes; }
// Absmax slots (per moment) of `elems` consecutive chunk elements: every start offset in
// [0, elems) that rounds up to a slot, ceil((elems - 1) / g) + 1.
constexpr int64_t QuantAbsmaxSlots(int64_t elems, int64_t dtype_bytes) {
  const int64_t g = QuantSlotElems(dtype_bytes);
  return elems <= 0 ? 0 : (elems - 1 + g - 1) / g + 1;
}
// Bytes of the absmax arrays of `elems` chunk elements (both moments); 0 for other optimizers.
constexpr int64_t QuantAbsmaxBytes(OptimizerKind kind, int64_t dtype_bytes, int64_t elems) {
  return kind == OptimizerKind::kAdamW8bit ? 2 * 4 * QuantAbsmaxSlots(elems, dtype_bytes) : 0;
}

// Moment tensors per parameter (exp_avg, exp_avg_sq) and the bytes of one element of each.
constexpr int64_t OptimizerMoments(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? 0 : 2;
}
constexpr int64_t OptimizerMomentElemBytes(OptimizerKind kind, int64_t dtype_bytes) {
  return kind == OptimizerKind::kAdamW8bit         ? 1
         : kind == OptimizerKind::kAdamWBf16States ? dtype_bytes
                                                   : 4;
}

// Device bytes per element of a persistent chunk's optimizer state (master + moments, allocated
// flat over the chunk's whole span); gradients come on top. adamw8bit adds its absmax arrays per
// chunk: PersistentStateBytes() is the whole figure.
constexpr int64_t PersistentStateBytesPerElem(OptimizerKind kind, int64_t dtype_bytes) {
  return (OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : 0) +
         OptimizerMoments(kind) * OptimizerMomentElemBytes(kind, dtype_bytes);
}
// Device bytes of a persistent chunk of `elems` elements: per-element state + absmax arrays.
constexpr int64_t PersistentStateBytes(OptimizerKind kind, int64_t dtype_bytes, int64_t elems) {
  return elems * PersistentStateBytesPerElem(kind, dtype_bytes) +
         QuantAbsmaxBytes(kind, dtype_bytes, elems);
}

// Transient device bytes per element of the persistent chunk being updated: the fp32 copy of its
// grads when the update runs on an fp32 master (one chunk at a time).
constexpr int64_t StepGradCopyBytesPerElem(OptimizerKind kind, int64_t dtype_bytes) {
  return OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : 0;
}

// [Sliced grad copy] The GPU update of persistent chunks converts grads to fp32 in slices of at
// most one regular chunk's elements (chunk_bytes / dtype_bytes): an oversized chunk (a vocabulary
// embedding of hundreds of millions of elements) is updated slice by slice, so the transient is
// one chunk-sized fp32 tensor of the same size every time, which the caching allocator reuses,
// instead of a single multi-GiB block that it must map above every hole of the step. Elements of
// the largest transient for a largest chunk of `largest_elems` trainable elements.
constexpr int64_t StepGradCopyElems(int64_t largest_elems, int64_t chunk_bytes,
                                    int64_t dtype_bytes) {
  const int64_t slice = chunk_bytes / dtype_bytes;
  return slice > 0 && slice < largest_elems ? slice : largest_elems;
}

// Host memory of one offloaded chunk of `chunk_bytes` (model dtype, alignment gaps included).
struct OffloadedChunkHostBytes {
  int64_t transfer_bytes = 0;  // parameters (upload source) + grad staging, in the model dtype;
                               // pinned when the host memory kind is pinned
  int64_t state_bytes = 0;     // always pageable: master, grad sum, moments
  constexpr int64_t total() const { return transfer_bytes + state_bytes; }
};

// The grad sum of an offloaded chunk, per element: fp32 when an fp32 master is updated from a
// narrower staging copy or micro-batches are summed (adamw, sgd); for adamw_bf16 the sum is kept
// in the parameter dtype (as torch accumulates .grad) and only exists with grad_accum > 1 (with
// one micro-batch the staging copy is the grad).
// adamw8bit sums like adamw_bf16 (the parameter dtype, as torch accumulates .grad before
// bitsandbytes reads it).
constexpr int64_t GradSumElemBytes(OptimizerKind kind, int64_t dtype_bytes, int grad_accum) {
  if (kind == OptimizerKind::kAdamWBf16States || kind == OptimizerKind::kAdamW8bit) {
    return grad_accum > 1 ? dtype_bytes : 0;
  }
  return OptimizerKeepsMaster(kind, dtype_bytes) || grad_accum > 1 ? 4 : 0;
}

constexpr OffloadedChunkHostBytes OffloadedChunkHost(OptimizerKind kind, int64_t dtype_bytes,
                                                     int grad_accum, int64_t chunk_bytes) {
  const int64_t elems = chunk_bytes / dtype_bytes;
  OffloadedChunkHostBytes b;
  b.transfer_bytes = 2 * chunk_bytes;
  b.state_bytes = elems * ((OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : 0) +
                           GradSumElemBytes(kind, dtype_bytes, grad_accum) +
                           OptimizerMoments(kind) * OptimizerMomentElemBytes(kind, dtype_bytes)) +
                  QuantAbsmaxBytes(kind, dtype_bytes, elems);
  return b;
}

// Host memory of one offloaded chunk of a frozen base (LoRA): its parameters only (the upload
// source, pinned when the host memory kind is pinned); no grad staging, master or state.
constexpr OffloadedChunkHostBytes FrozenChunkHost(int64_t chunk_bytes) {
  OffloadedChunkHostBytes b;
  b.transfer_bytes = chunk_bytes;
  return b;
}

// [Deferred CPU updates] (agent/chunks/chunk_manager.h): one rank's Step() leaves the offloaded
// chunks' CPU updates running beside the next step's forward, which meets each chunk's update
// before uploading it, whether they started in backward (no clipping) or in Step() (clipping);
// sharded runs wait inside Step(). The planner prices the step from the same rule (planner/cost,
// StepTime).
constexpr bool StepUpdatesDeferred(int world_size) { return world_size <= 1; }

// [Speculative clipped updates] (agent/chunks/chunk_manager.h): with clipping, one rank and one
// micro-batch a step, an offloaded chunk's CPU update may start in backward as if the step were
// not clipped, writing a second copy of everything the update writes; when the global norm then
// asks for clipping, Step() updates again from the live arrays with the coefficient, and at the
// end of a step that stands the copies become the live arrays. The second copies of one
// offloaded chunk of `chunk_bytes`: the fp32 master where there is one (the parameters are
// rounded from it), else the parameters (pinned like the chunk's upload source); the moments;
// adamw8bit's absmax slots.
constexpr int64_t SpeculationBackupBytes(OptimizerKind kind, int64_t dtype_bytes,
                                         int64_t chunk_bytes) {
  const int64_t elems = chunk_bytes / dtype_bytes;
  return elems * ((OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : dtype_bytes) +
                  OptimizerMoments(kind) * OptimizerMomentElemBytes(kind, dtype_bytes)) +
         QuantAbsmaxBytes(kind, dtype_bytes, elems);
}
// Whether Step() may speculate at all: clipping on, one rank (the deferred path), one
// micro-batch a step (the norm is then taken on the device, with no pass over host grads) and no
// non-finite check (which would have to see the whole step first).
constexpr bool SpeculationApplies(bool clipping, int world_size, int grad_accum,
                                  bool skip_nonfinite) {
  return clipping && StepUpdatesDeferred(world_size) && grad_accum == 1 && !skip_nonfinite;
}
// Whether speculation pays for itself where it applies and the norm stays under the threshold,
// as measured: llama-3.1-8b 1x4096, 62 offloaded chunks, H200 host, a clip threshold the norm
// stays under, against the same step waiting for the norm (docs/benchmarks.md, "Thirtieth
// session": one call, pieces through a tile): adamw8bit 1.026 against 1.114 s, adamw_bf16 0.812
// against 0.843 s; 1-4 % for adamw_bf16 over three calls, never slower. fp32-master adamw and sgd
// are not measured (the 8B plan's fp32 state and its copies would not fit that host's RAM).
constexpr bool SpeculationPays(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW8bit || kind == OptimizerKind::kAdamWBf16States;
}

// [Sharded chunks] (agent/chunks/chunk_manager.cc): with W ranks a non-persistent chunk of
// `elems` elements is padded to a multiple of W and each rank holds ShardElems() of it; the
// all-gather target (a device buffer) holds PaddedElems().
constexpr int64_t ShardElems(int64_t elems, int world_size) {
  return world_size > 1 ? (elems + world_size - 1) / world_size : elems;
}
constexpr int64_t PaddedElems(int64_t elems, int world_size) {
  return ShardElems(elems, world_size) * (world_size > 1 ? world_size : 1);
}

// [State reduce-scatter per group] (agent/chunks/chunk_manager.cc): with sharded persistent
// state, a persistent chunk of `elems` elements is reduce-scattered from a flat tensor over its
// padded span into an fp32 shard: an fp32 flat, or for a 16-bit model ([Narrow reduce-scatter])
// a 16-bit flat and the 16-bit receive buffer of its exchange, the same bytes. They live from the
// hook of the group that completes the chunk in backward to the next group's hook (or the step's,
// after the last group). The device bytes, which the agent allocates and the planner charges per
// stage.
constexpr int64_t StateReduceScatterBytes(int64_t elems, int world_size) {
  return (PaddedElems(elems, world_size) + ShardElems(elems, world_size)) * 4;
}

// One rank's host memory for an offloaded chunk of `chunk_bytes` over `world_size` ranks: the
// unsharded figures of its shard (every host array is sized ShardElems()).
constexpr OffloadedChunkHostBytes OffloadedShardHost(OptimizerKind kind, int64_t dtype_bytes,
                                                     int grad_accum, int64_t chunk_bytes,
                                                     int world_size) {
  return OffloadedChunkHost(kind, dtype_bytes, grad_accum,
                            ShardElems(chunk_bytes / dtype_bytes, world_size) * dtype_bytes);
}

// HBM bytes one GPU update of a persistent parameter reads and writes per element (clipping not
// included), as the agent runs it:
//   master (adamw, sgd on bf16): grad -> fp32 copy (E + 4), the update on the fp32 master, the
//     master rounded into the parameter (4 + E);
//   adamw update: param r/w, grad read, two moments r/w (fused kernel, one pass);
//   sgd update: grad.add_(param, weight_decay) (3 x) then param.add_(grad, -lr) (3 x), charged
//     with weight decay on (the default).
//   adamw8bit: the fused CUDA kernel that a CUDA build runs: grad read, parameter r/w, both
//     moments' codes r/w (3 E + 4). Without it (fused_8bit_kernel false: a build without nvcc)
//     LibTorch ops, agent/chunks/adamw8bit_torch.cc, one pass per op, per moment:
//     dequantize 29 (codes widened to int64 1 + 8, map gather 8 + 4, scaled by the absmax 8),
//     quantize 43 (|x| 8, block max 4, x / absmax 8, select 8, bucketize 4 + 4, narrowed to
//     uint8 4 + 1, stored 2); the update on fp32: moments 20 + 24, denominator 24, decay 8,
//     addcdiv 16; for narrower parameters the grad and parameter widened (E + 4 each) and the
//     parameter rounded back (4 + E). bf16: 254 B, about 18x adamw_bf16's fused pass.
constexpr int64_t GpuOptimizerTouchBytesPerElem(OptimizerKind kind, int64_t dtype_bytes,
                                                bool fused_8bit_kernel = true) {
  if (kind == OptimizerKind::kAdamW8bit) {
    // The fused kernel (agent/chunks/adamw8bit_kernel.cu): grad read, parameter read and
    // written, both moments' codes read and written; absmax (4 B per 256 elements) left out.
    if (fused_8bit_kernel) return 3 * dtype_bytes + 2 * 2;
    const int64_t widen = dtype_bytes == 4 ? 0 : 3 * (dtype_bytes + 4);
    return 2 * (29 + 43) + 20 + 24 + 24 + 8 + 16 + widen;
  }
  const bool master = OptimizerKeepsMaster(kind, dtype_bytes);
  const int64_t w = master ? 4 : dtype_bytes;  // width the update runs in
  const int64_t convert = master ? 2 * (dtype_bytes + 4) : 0;
  if (kind == OptimizerKind::kSgd) return convert + 6 * w;
  return convert + 3 * w + 2 * 2 * OptimizerMomentElemBytes(kind, dtype_bytes);
}

// [Fused 8-bit kernel time] The fused adamw8bit kernel does not run at the HBM rate its bytes
// would take: one CUDA block per 256-element quantization block, two block-wide maxima (with
// their barriers) and two binary searches of the 256-entry maps per element. On an H200 its pass
// over qwen2.5-7b (7.6 G parameters, 5x768, every chunk persistent, clipping on) made the step
// 0.058 s longer than adamw_bf16's on the same plan (0.416 against 0.358 s), whose 14 B an
// element the planner prices at its HBM rate: the 8-bit pass ran at about 0.27 of that rate over
// its 10 B. The planner prices it at that share.
inline constexpr double kFusedAdamW8bitHbmShare = 0.27;

// The optimizer's dtype requirement; empty when `dtype` is accepted. adamw_bf16 needs bf16;
// adamw8bit runs on fp32 and bf16 parameters.
constexpr const char* OptimizerDTypeProblem(OptimizerKind kind, DType dtype) {
  if (kind == OptimizerKind::kAdamW8bit && dtype == DType::kFloat16) {
    return "optimizer adamw8bit updates fp32 or bf16 parameters (--dtype fp32 or bf16)";
  }
  return kind == OptimizerKind::kAdamWBf16States && dtype != DType::kBFloat16
             ? "optimizer adamw_bf16 keeps bf16 parameters and states without an fp32 master: it "
               "needs a bf16 model (--optimizer adamw_bf16 with --dtype bf16)"
             : "";
}

// CPU optimizer time of one element relative to adamw's, for a profile that did not measure the
// optimizer itself. adamw8bit dequantizes and requantizes both moments around the same update:
// 1.32x to 1.41x with memplan-cpu-adam-bench 16777216 1 (bf16, one thread) on the development VM
// since the fused AVX-512 pass, 1.27x at one thread and 0.78x at 16 on the H200 host
// (docs/benchmarks.md, "8-bit AdamW: fused AVX-512 pass"); the one-thread figure, rounded up.
inline constexpr double kAdamW8bitCpuTimeFactor = 1.4;
constexpr double CpuOptimizerTimeFactor(OptimizerKind kind) {
  return kind == OptimizerKind::kAdamW8bit ? kAdamW8bitCpuTimeFactor : 1.0;
}
// Offloaded-chunk updates per second: the profile's measured rate of that optimizer
// (memplan-agent bench measures adamw's bf16 pass and adamw8bit's), else adamw's scaled by
// CpuOptimizerTimeFactor.
constexpr double CpuOptimizerParamsPerSecond(OptimizerKind kind, const HardwareSpec& hardware) {
  if (kind == OptimizerKind::kAdamW8bit && hardware.cpu_adamw8bit_params_per_second > 0) {
    return hardware.cpu_adamw8bit_params_per_second;
  }
  return hardware.cpu_adam_params_per_second / CpuOptimizerTimeFactor(kind);
}

// [Two CPU passes]
// The chunk manager works on an offloaded chunk's grads in two passes on its CPU pool: when a
// micro-batch's grads reach the host it adds them into the chunk's grad array (the accumulate
// pass, beside the rest of backward); once the chunk may be updated (its last micro-batch without
// clipping, after the global norm with it) the optimizer reads that array and updates the chunk
// (the update pass). memplan-agent bench times each pass on arrays far beyond the last-level
// cache (HardwareSpec::cpu_grad_accumulate_params_per_second, cpu_adam_update_params_per_second).
// A profile without them prices the two as a single pass at the optimizer's whole-pass rate.
// Bytes per element for a bf16 model with AdamW, a written cache line counted as read as well
// (write-allocate): accumulate 2 (bf16 grad) + 4 + 4 (fp32 grad read, written) = 10; update 4
// (fp32 grad) + 3 x 8 (master and both moments read and written) + 4 (bf16 param) = 32; the fused
// pass the bench reports as cpu_adamw keeps a range's fp32 grad in cache between the two, 38.
// The passes are memory-bound, so these ratios turn a whole-pass figure into the two passes
// (presets) and the accumulate rate into a host read bandwidth (the norm pass).
inline constexpr double kCpuAccumulateBytesPerParam = 10;
inline constexpr double kCpuUpdateBytesPerParam = 32;
inline constexpr double kCpuFusedPassBytesPerParam = 38;

// Bytes per element of an offloaded chunk's grad array as the update reads it: fp32 when the
// update runs on a master (or the model is fp32), else the parameter dtype.
constexpr int64_t HostGradElemBytes(OptimizerKind kind, int64_t dtype_bytes) {
  return OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : dtype_bytes;
}

// [CPU pass bytes] Host bytes the update pass touches per element, by optimizer (a written cache
// line counted as read too): the grad array as the update reads it (HostGradElemBytes), the fp32
// master read and written plus the model-dtype parameter written, or the parameter alone read and
// written, and each moment read and written. bf16 model: adamw 4 + 8 + 4 + 16 = 32
// (kCpuUpdateBytesPerParam), adamw_bf16 2 + 4 + 8 = 14, sgd 4 + 8 + 4 = 16, adamw8bit 2 + 4 + 4
// = 10 (its codes; it is priced from its own bench figure, the dequantizing work being the
// cost). The passes are memory-bound, so an optimizer the bench did not time updates at adamw's
// measured rate times 32 over its bytes. Measured in training on the H200 host (qwen2.5-1.5b, 46
// offloaded chunks, 16 threads, the step log's cpu_update_params_per_second): adamw 3.7-4.1e9,
// adamw_bf16 8.5-9.2e9 (2.2x; 2.29x priced), sgd 7.4-7.6e9 (1.9x; 2.0x priced).
constexpr int64_t CpuUpdateBytesPerParam(OptimizerKind kind, int64_t dtype_bytes) {
  const bool master = OptimizerKeepsMaster(kind, dtype_bytes);
  const int64_t param = master ? 2 * 4 + 2 * dtype_bytes : 2 * dtype_bytes;
  return HostGradElemBytes(kind, dtype_bytes) + param +
         2 * OptimizerMoments(kind) * OptimizerMomentElemBytes(kind, dtype_bytes);
}

// Whether the agent runs the accumulate pass at all: only into a grad sum
// (GradSumElemBytes > 0); otherwise the update reads the staging copy itself.
constexpr bool CpuAccumulatePass(OptimizerKind kind, int64_t dtype_bytes, int grad_accum) {
  return GradSumElemBytes(kind, dtype_bytes, grad_accum) > 0;
}

struct CpuPassRates {
  // 0: the profile has no separate accumulate figure, or the optimizer has no accumulate pass
  // (CpuAccumulatePass); nothing is charged beside backward and update_params_per_second is the
  // whole pass.
  double accumulate_params_per_second = 0;
  double update_params_per_second = 0;
};

// The offloaded-chunk CPU rates of `kind` on `hardware` for a model of `dtype_bytes` with
// `grad_accum` micro-batches ([Two CPU passes]). The bench's passes are adamw's on a bf16 model:
// the optimizers with an accumulate pass (CpuAccumulatePass) accumulate at its rate; adamw8bit
// updates at its measured rate (else adamw's over CpuOptimizerTimeFactor), the others at adamw's
// scaled by their bytes ([CPU pass bytes]). A profile without the two figures prices one whole
// pass, scaled the same way.
constexpr CpuPassRates CpuOptimizerPassRates(OptimizerKind kind, const HardwareSpec& hardware,
                                             int64_t dtype_bytes = 2, int grad_accum = 1) {
  CpuPassRates r;
  const double bytes_scale =
      kind == OptimizerKind::kAdamW8bit
          ? 1.0
          : static_cast<double>(kCpuUpdateBytesPerParam) /
                static_cast<double>(CpuUpdateBytesPerParam(kind, dtype_bytes));
  const bool accumulates = CpuAccumulatePass(kind, dtype_bytes, grad_accum);
  if (hardware.cpu_grad_accumulate_params_per_second <= 0 ||
      hardware.cpu_adam_update_params_per_second <= 0) {
    // The whole-pass figure is adamw's fused pass, 38 B: its update's 32 and the 6 the
    // accumulation adds when the fp32 grad stays in cache (bf16 read, fp32 written).
    const double pass_bytes = static_cast<double>(CpuUpdateBytesPerParam(kind, dtype_bytes)) +
                              (accumulates ? kCpuFusedPassBytesPerParam - kCpuUpdateBytesPerParam
                                           : 0.0);
    r.update_params_per_second =
        kind == OptimizerKind::kAdamW8bit
            ? CpuOptimizerParamsPerSecond(kind, hardware)
            : hardware.cpu_adam_params_per_second * kCpuFusedPassBytesPerParam / pass_bytes;
    return r;
  }
  if (accumulates) r.accumulate_params_per_second = hardware.cpu_grad_accumulate_params_per_second;
  // The bench's own figure of this optimizer's update where it has one (a bf16 model's: the
  // bench runs bf16 parameters), else adamw's scaled by bytes.
  const double measured = kind == OptimizerKind::kAdamW8bit ? hardware.cpu_adamw8bit_params_per_second
                          : kind == OptimizerKind::kAdamWBf16States
                              ? hardware.cpu_adamw_bf16_params_per_second
                          : kind == OptimizerKind::kSgd && dtype_bytes == 2
                              ? hardware.cpu_sgd_params_per_second
                              : 0.0;
  r.update_params_per_second =
      measured > 0 ? measured
                   : hardware.cpu_adam_update_params_per_second * bytes_scale /
                         CpuOptimizerTimeFactor(kind);
  return r;
}


}  // namespace memplan
