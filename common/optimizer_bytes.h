// What each optimizer holds and moves per parameter element: the one definition that the agent's
// ChunkManager allocates by (agent/chunks) and the planner's cost model charges (planner/cost).
// Header-only, torch- and proto-free; pure functions.
//
//   adamw       torch AdamW with mixed precision: fp32 exp_avg + exp_avg_sq, and an fp32 master
//               when the parameters are narrower than fp32 (the update runs on the master).
//   adamw_bf16  pure low-precision AdamW (torch.optim.AdamW(fused=True) on bf16 parameters):
//               exp_avg + exp_avg_sq in the parameter dtype, no master; requires bf16 parameters.
//   sgd         torch SGD (no momentum): no state; an fp32 master when the parameters are narrower.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace memplan {

// The update runs on an fp32 master copy (parameters narrower than fp32, adamw and sgd).
constexpr bool OptimizerKeepsMaster(OptimizerKind kind, int64_t dtype_bytes) {
  return kind != OptimizerKind::kAdamWBf16States && dtype_bytes != 4;
}

// Moment tensors per parameter (exp_avg, exp_avg_sq) and the bytes of one element of each.
constexpr int64_t OptimizerMoments(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? 0 : 2;
}
constexpr int64_t OptimizerMomentElemBytes(OptimizerKind kind, int64_t dtype_bytes) {
  return kind == OptimizerKind::kAdamWBf16States ? dtype_bytes : 4;
}

// Device bytes per element of a persistent chunk's optimizer state (master + moments, allocated
// flat over the chunk's whole span); gradients come on top.
constexpr int64_t PersistentStateBytesPerElem(OptimizerKind kind, int64_t dtype_bytes) {
  return (OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : 0) +
         OptimizerMoments(kind) * OptimizerMomentElemBytes(kind, dtype_bytes);
}

// Transient device bytes per element of the persistent chunk being updated: the fp32 copy of its
// grads when the update runs on an fp32 master (one chunk at a time).
constexpr int64_t StepGradCopyBytesPerElem(OptimizerKind kind, int64_t dtype_bytes) {
  return OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : 0;
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
constexpr int64_t GradSumElemBytes(OptimizerKind kind, int64_t dtype_bytes, int grad_accum) {
  if (kind == OptimizerKind::kAdamWBf16States) return grad_accum > 1 ? dtype_bytes : 0;
  return OptimizerKeepsMaster(kind, dtype_bytes) || grad_accum > 1 ? 4 : 0;
}

constexpr OffloadedChunkHostBytes OffloadedChunkHost(OptimizerKind kind, int64_t dtype_bytes,
                                                     int grad_accum, int64_t chunk_bytes) {
  const int64_t elems = chunk_bytes / dtype_bytes;
  OffloadedChunkHostBytes b;
  b.transfer_bytes = 2 * chunk_bytes;
  b.state_bytes = elems * ((OptimizerKeepsMaster(kind, dtype_bytes) ? 4 : 0) +
                           GradSumElemBytes(kind, dtype_bytes, grad_accum) +
                           OptimizerMoments(kind) * OptimizerMomentElemBytes(kind, dtype_bytes));
  return b;
}

// Host memory of one offloaded chunk of a frozen base (LoRA): its parameters only (the upload
// source, pinned when the host memory kind is pinned); no grad staging, master or state.
constexpr OffloadedChunkHostBytes FrozenChunkHost(int64_t chunk_bytes) {
  OffloadedChunkHostBytes b;
  b.transfer_bytes = chunk_bytes;
  return b;
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
constexpr int64_t GpuOptimizerTouchBytesPerElem(OptimizerKind kind, int64_t dtype_bytes) {
  const bool master = OptimizerKeepsMaster(kind, dtype_bytes);
  const int64_t w = master ? 4 : dtype_bytes;  // width the update runs in
  const int64_t convert = master ? 2 * (dtype_bytes + 4) : 0;
  if (kind == OptimizerKind::kSgd) return convert + 6 * w;
  return convert + 3 * w + 2 * 2 * OptimizerMomentElemBytes(kind, dtype_bytes);
}

// The optimizer's dtype requirement; empty when `dtype` is accepted. adamw_bf16 needs bf16.
constexpr const char* OptimizerDTypeProblem(OptimizerKind kind, DType dtype) {
  return kind == OptimizerKind::kAdamWBf16States && dtype != DType::kBFloat16
             ? "optimizer adamw_bf16 keeps bf16 parameters and states without an fp32 master: it "
               "needs a bf16 model (--optimizer adamw_bf16 with --dtype bf16)"
             : "";
}

}  // namespace memplan
