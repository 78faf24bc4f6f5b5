// ChunkManager: packs a model's parameters into fixed-size chunks (common/chunk_packing.h),
// keeps the first n_persist chunks on the device and the rest in host memory, streams
// non-persistent chunks through n_buffer device buffers around each group's forward/backward, and
// runs the optimizer step (adamw, adamw_bf16, adamw8bit or sgd; on the device for persistent
// chunks, multi-threaded CPU for the others). With a communicator of world size W > 1, ZeRO-3
// over chunks ([Sharded chunks] in chunk_manager.cc): each rank holds 1/W of every
// non-persistent chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/core/param_residency.h"
#include "agent/core/torch_pch.h"
#include "agent/dist/communicator.h"
#include "agent/dist/gather_bandwidth.h"
#include "common/chunk_packing.h"
#include "common/types.h"

namespace memplan {

struct ChunkManagerOptions {
  int64_t chunk_bytes = int64_t{64} << 20;
  int64_t alignment_bytes = 256;  // every parameter starts at a multiple of this inside its chunk
  int n_persist = 0;              // the first n_persist chunks stay on the device
  int n_buffer = 2;               // shared device buffers for non-persistent chunks (raised to the
                                  // minimum a group needs, with a warning, see MinBuffers());
                                  // oversized chunks get one of their own on top
  HostMemoryKind host_memory = HostMemoryKind::kPinned;
  // [Sharded loading] The parameters carry shapes but no values yet (LlamaModelOptions::
  // deferred_values): nothing is copied from them; what this rank stores starts at zero and the
  // caller fills it with LoadRanges.
  bool deferred_values = false;
  bool pageable_fallback = true;  // pinning failed (no CUDA, memlock): use pageable, else error
  torch::Device device = torch::kCPU;
  // adamw (fp32 moments, fp32 master for bf16 models), adamw_bf16 (bf16 parameters and moments,
  // no master: bf16 models only), adamw8bit (bitsandbytes' AdamW8bit: uint8 moments with an
  // absmax per 256-element block, no master; needs alignment_bytes % 256 == 0) or sgd (no state;
  // fp32 master for bf16 models). What each holds is common/optimizer_bytes.h.
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  AdamWOptions adamw;  // sgd uses its lr and weight_decay
  // adamw8bit on a bf16 model (no master): the updates are rounded into the parameters
  // stochastically with this seed ([Stochastic rounding], stochastic_rounding.h), the same way in
  // every placement; false rounds to nearest even, as bitsandbytes does.
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
  int cpu_threads = 4;  // CPU optimizer worker threads
  // [Grad copy backlog] Backward groups whose offloaded grads may still be on their way to the
  // host (CUDA) when the next group's backward is enqueued; beyond that the host waits for the
  // oldest group's copies. Each grad is freed once its copy is queued, so the backlog is memory
  // the caching allocator cannot hand out yet. >= 1.
  int max_grad_copy_groups = 2;
  int grad_accum = 1;   // micro-batches per Step(): the CPU update of a chunk starts once
                        // the last micro-batch's grads of that chunk have arrived
  // Sharded with grad_accum > 1: keep each offloaded chunk's fp32 grads on the device across
  // the step's micro-batches and reduce-scatter them once, after the last one (one collective
  // per chunk and step instead of one per micro-batch), at the cost of every offloaded chunk's
  // padded fp32 grads staying on the device until then ([Sharded chunks]).
  bool accumulate_sharded_grads_on_device = false;
  // The max_grad_norm the trainer passes to Step(). 0 (no clipping) lets the CPU update of each
  // offloaded chunk start during backward; > 0 needs the global norm, so updates wait for Step();
  // < 0 = unknown: behave as > 0. Step() with a different value is honoured, except that
  // clipping cannot be applied after updates started (Step() then fails).
  double max_grad_norm = -1;
  // [Non-finite steps] Step() computes the global gradient norm before it updates anything and,
  // when the norm is NaN or infinite, drops the step's gradients and updates nothing
  // (LastStepSkipped()). It therefore holds every CPU update until Step(), as clipping does; with
  // grad_accum > 1 the norm costs one pass over the offloaded chunks' host gradients.
  bool skip_nonfinite = false;
  // [Deferred CPU updates] Step() returns without waiting for the offloaded chunks' CPU updates.
  // Those it runs itself (clipping, a non-finite check, anything else that held them back during
  // backward) are queued in chunk order, the order the next forward needs them; those that
  // started in backward (no clipping) are left running as they are. The next forward uploads
  // each chunk as soon as its own update is done (the pager waits per chunk), so the updates run
  // beside that forward instead of stalling the step. The arithmetic is the same; state I/O
  // (Params(), checkpoints, export), ZeroGrad() and the next Step() wait for every update, the
  // next backward for a chunk's before staging its grads, and a failed update is reported by the
  // next Step(). Not with sharded chunks (their gathers read the host shards): common/
  // optimizer_bytes.h StepUpdatesDeferred, which the planner prices the step from.
  bool defer_step_updates = true;
  // [Speculative clipped updates] (common/optimizer_bytes.h SpeculationApplies: clipping, one
  // rank, grad_accum 1, no skip_nonfinite). When the previous step needed no clipping, this step's
  // offloaded CPU updates start in backward, as without clipping, writing a second copy of the
  // chunk's written state (master or parameters, moments, absmax: SpeculationBackupBytes() of
  // host memory per offloaded chunk, allocated at Create, the parameters' pinned like
  // param_host) while the live state stays as it was. If the global norm then asks for
  // clipping, Step() waits for them and updates again from the live state with the coefficient;
  // a Step() that stands makes the copies live; ZeroGrad() and a failed Step() drop them.
  // Either way every parameter and
  // state ends as clipping after backward leaves it, bit for bit; a step that clips pays the
  // waiting step's time and more, and the next one does not speculate. The first step never does.
  bool speculative_clip = false;
  // [Device updates of offloaded chunks] The share, 0 to 1, of the offloaded chunks whose update
  // runs on the device instead of the CPU workers when Step() runs it (clipping or a non-finite
  // check held it until the norm): every k-th chunk in chunk order, the rest on the CPU, so both
  // finish in the order the next forward needs the chunks. Each such chunk's parameters, grads,
  // moments (and adamw8bit's absmax slots) are copied to two device slots in turn (4x the
  // chunk's bytes each, from the caching allocator while the step's updates run), updated there
  // as a persistent chunk is ([Persistent update]: torch's fused AdamW on the device, the same
  // clip) and copied back; the pager uploads the chunk once its copies back are done. The host
  // memory traffic moves from the CPU cores to the copy engines, which run beside them. Its
  // host arrays are pinned. adamw_bf16 and adamw8bit, one rank, CUDA (a CPU device runs the
  // same path synchronously), chunks no larger than a regular one; ignored elsewhere.
  double device_update_share = 0;
  // Sharded (world size W > 1): persistent chunks keep their parameters replicated on every rank
  // but their optimizer state sharded ([Sharded persistent state] in chunk_manager.cc, ZeRO-2
  // over the persistent chunks): each rank holds 1/W of every persistent chunk's master and
  // moments, its grads are reduce-scattered (not all-reduced) in backward, each rank updates its
  // shard and the updated parameters are all-gathered. adamw, adamw_bf16 and sgd (not adamw8bit).
  // Ignored with W = 1 and for frozen or profile_only managers.
  bool shard_persistent_state = false;
  // Sharded, with shard_persistent_state: the persistent chunks' parameters are sharded too
  // ([Sharded persistent parameters] in chunk_manager.cc, ZeRO-3 over the persistent chunks):
  // each rank keeps 1/W of every persistent chunk on the device; a chunk is all-gathered from the
  // shards into device memory of its own before a group uses it (the next group's prefetched)
  // and that memory is given back when neither the group nor the next one uses it. The update
  // writes the shard only: no all-gather after the step.
  bool shard_persistent_params = false;
  // Sharded: the all-gathers of the chunks one hook uploads start as one coalesced collective
  // ([Coalesced gathers] in chunk_manager.cc); false starts one per chunk (for comparison).
  bool coalesce_gathers = true;
  // On-demand profiling (agent/profiler): the manager only moves parameters. No optimizer state
  // and no gradient staging are allocated (host or device), every gradient is dropped in the
  // PostBackward of the group after which it is final, and Step() fails. What a model larger than
  // the card needs to run forward and backward with one group's chunks on the device at a time.
  bool profile_only = false;
  // A frozen base (LoRA, agent/model): parameters that take no gradient (requires_grad false,
  // checked at Create) and are never updated. As with profile_only only the parameters are held
  // (no grad staging, master or optimizer state, host or device); Step() and ZeroGrad() succeed
  // and do nothing, so a trainer steps it beside the adapters' manager. Sharded (W > 1): each
  // rank stores 1/W of every offloaded chunk, and of every persistent one with
  // shard_persistent_params (shard_persistent_state not needed), gathered before use
  // ([Sharded frozen base] in chunk_manager.cc).
  bool frozen = false;
};

// What the manager holds, for reports and the planner's measurements. Exact sizes (no rounding).
// A frozen (or profile_only) manager holds parameters only: every state figure is 0 and an
// offloaded chunk's host memory is its S bytes of parameters (FrozenChunkHostBytes()).
// Per chunk of S bytes, both as common/optimizer_bytes.h defines them for the planner:
//   persistent: S x PersistentStateBytesPerElem / E of optimizer state on the device;
//   offloaded: OffloadedChunkHost(): transfer 2 S (parameters + grad staging; pinned, or pageable
//   when host_memory = pageable) + state (master, grad sum, moments; always pageable).
struct ChunkMemoryStats {
  int world_size = 1;  // > 1: host figures are this rank's shards (1/world_size of each chunk)
  std::vector<int64_t> chunk_bytes;  // per chunk, exact (common/chunk_packing.h)
  int n_chunks = 0;
  std::string layout_fingerprint;  // [Layout fingerprint] (common/chunk_packing.h)
  int n_persist = 0;
  int n_buffer = 0;             // shared buffers allocated (>= options.n_buffer)
  int n_oversized_buffers = 0;  // one per non-persistent oversized chunk, sized to it
  int64_t layout_bytes = 0;                   // sum of all chunk sizes in the model dtype
  int64_t persistent_device_bytes = 0;        // persistent chunks (params only, model dtype)
                                              // (shard_persistent_params: this rank's shards)
  // shard_persistent_params: the most bytes of gathered persistent chunks held at once (a
  // group's and the next one's, padded), from the layout ([Sharded persistent parameters]).
  int64_t persistent_gather_device_bytes = 0;
  int persistent_gathers = 0;  // persistent chunks all-gathered before use so far
  int64_t persistent_state_device_bytes = 0;  // their optimizer state (moments, fp32 master);
                                              // grads come on top
  int64_t buffer_device_bytes = 0;  // n_buffer x largest regular chunk + oversized chunks' own
  // [Grad staging slots] (common/chunk_packing.h): the device slots of the blocks' offloaded
  // grads (one rank, something offloaded), allocated for the manager's life.
  int64_t grad_slot_device_bytes = 0;
  int64_t grads_from_slots = 0;  // offloaded grads staged to the host from a slot so far
  // [State reduce-scatter per group] Sharded persistent state: per group, the device bytes of
  // the persistent chunks' reduce-scatter buffers left in flight by its backward hook in the
  // latest backward (held beside the next group's backward, after group 0 until the step), as
  // allocated; empty before the first sharded backward.
  std::vector<int64_t> state_reduce_device_bytes_by_group;
  int64_t host_pinned_bytes = 0;    // transfer buffers (params + grad staging) when pinned
  int64_t host_pageable_bytes = 0;  // everything else on the host (master, grad sum, moments)
  bool pinned_fallback = false;     // pinned was requested but pageable is used
  std::string pinned_fallback_reason;
};

// Host-to-device chunk uploads (parameters into device buffers), for bandwidth reports.
// The CPU workers' passes over offloaded chunks since the last TakeCpuPassStats(): thread-seconds
// inside the grad accumulation and inside the optimizer update (task time, the wait for the
// grads' copy excluded), and the elements updated. Divided by the pool's threads, the seconds are
// the wall time of a fully parallel pool: what the planner's CPU rates price
// (HardwareSpec::cpu_adam_update_params_per_second, cpu_grad_accumulate_params_per_second).
struct CpuPassStats {
  int threads = 0;
  double accumulate_thread_seconds = 0;
  double update_thread_seconds = 0;
  int64_t accumulated_elems = 0;
  int64_t updated_elems = 0;
  // [Device updates of offloaded chunks]: elements of offloaded chunks updated on the device.
  int64_t device_updated_elems = 0;
};

struct ChunkUploadStats {
  int64_t uploads = 0;
  int64_t bytes = 0;
  // Sum of the uploads' durations from CUDA events around each copy on the upload stream (after
  // any wait for the compute stream); 0 on CPU.
  double seconds = 0;
  // Sharded: the uploads that are all-gathers of a chunk's shards (each counted above with the
  // gathered chunk's bytes), and those whose device time the backend measured ([Collective
  // timing], agent/dist/communicator.h: NCCL's own events; Gloo does not time): their output
  // bytes and summed device seconds. Bus bandwidth as nccl-tests reports it:
  // gather_output_bytes / gather_seconds x (W - 1) / W.
  int64_t gathers = 0;
  int64_t gathers_timed = 0;
  int64_t gather_output_bytes = 0;
  double gather_seconds = 0;
  // The device seconds of each timed all-gather, in the order every rank finishes them (the same
  // on every rank), the first kMaxGatherSamples after creation or ResetUploadStats(): what
  // per-gather comparisons across ranks need (a collective's time on a rank includes waiting for
  // the last rank to arrive).
  static constexpr size_t kMaxGatherSamples = 16384;
  std::vector<float> gather_seconds_each;
  int64_t gather_sampled_bytes = 0;  // output bytes of the gathers in gather_seconds_each
};

// CompareGatherTimes (agent/dist/gather_bandwidth.h) over the all-gathers a manager sampled
// (ChunkUploadStats::gather_seconds_each).
inline absl::StatusOr<std::optional<GatherBandwidth>> CompareGatherTimes(
    Communicator& comm, const ChunkUploadStats& u) {
  return CompareGatherTimes(comm, u.gather_seconds_each, u.gather_sampled_bytes);
}

// Implements ParamResidency for the model and the optimizer step for the trainer.
// Not thread-safe: calls must not overlap (the hooks may come from autograd's device thread,
// the rest from the training thread); it runs its own CPU optimizer workers.
//
// Residency: persistent chunks live in one flat device tensor each, parameters being views into
// it. An offloaded chunk is uploaded into its home buffer (always the same one, see [Fixed buffer
// slots] in chunk_manager.cc) by Pre{Forward,Backward} of a group that uses it, which also
// prefetches the next group's chunks (previous group's in backward) on a side stream. Nothing is
// released in PostForward: a chunk stays resident until another chunk needs its buffer, so the
// chunks used last in forward serve the first groups of backward without a reload. Released
// parameters keep their shape and dtype (a 0-dim expanded placeholder).
// Gradients: persistent ones accumulate on the device as usual. Offloaded ones are copied to
// host after their last group's backward (device-to-host on a side stream), summed over
// micro-batches by the CPU workers (fp32; in bf16 with adamw_bf16, as torch sums a bf16 .grad),
// and the chunk's CPU update runs as soon as its grads are final when max_grad_norm is 0; with
// clipping it runs in Step(), after the global norm.
class ChunkManager : public ParamResidency {
 public:
  // Copies the current values of every parameter into the chunks; afterwards parameters of
  // non-persistent chunks are shape-preserving placeholders until their group's PreForward.
  // Parameters are identified by tensor identity (a tied weight listed twice is packed once).
  // `communicator` (not owned, must outlive the manager): null or world size 1 runs one rank;
  // world size > 1 shards ([Sharded chunks]): every rank must create its manager from the same
  // model values and options, and call the hooks, Step, Params, Grads and OptimizerState in the
  // same order (they run collectives). Its device must be options.device's kind.
  // [Sharded loading] With options.deferred_values the parameters have no values: the manager
  // allocates only what this rank stores (zeros) and the caller fills it with LoadRanges, so no
  // rank ever holds the whole model.
  static absl::StatusOr<std::unique_ptr<ChunkManager>> Create(const ParamGroups& groups,
                                                              const ChunkManagerOptions& options,
                                                              Communicator* communicator = nullptr);
  ~ChunkManager() override;

  // The layout Create() packs `groups` into (each distinct tensor once, at its first group, in
  // the groups' order; options.chunk_bytes and alignment_bytes), without copying anything: what a
  // plan's n_chunks and layout_fingerprint are checked against before the run allocates.
  static absl::StatusOr<ChunkPacking> LayoutOf(const ParamGroups& groups,
                                               const ChunkManagerOptions& options);

  void PreForward(int group) override;
  void PostForward(int group) override;
  void PreBackward(int group) override;
  void PostBackward(int group) override;

  // Clips gradients by global L2 norm (max_grad_norm = 0: off; same formula and order as
  // torch::nn::utils::clip_grad_norm_ over the parameters in ParamOrder(); sharded: the norm over
  // every rank's shards, equal up to summation order), then updates every parameter and waits for
  // all updates. A failed collective (a rank gone) is returned here, naming the rank. Ends the
  // step: the next PostBackward starts a new accumulation.
  absl::Status Step(double max_grad_norm);
  // Drops accumulated gradients (device .grad and host accumulators) without updating.
  void ZeroGrad();
  // The learning rate of the updates from now on (a schedule's value for the coming step). Call
  // between steps, before the step's backward: offloaded chunks may start updating during it.
  void SetLearningRate(double lr);

  // Global grad norm computed by the last Step() (before clipping); NaN when it was not computed
  // (no clipping and grad_accum > 1, where it would cost a pass over the host gradients).
  double LastGradNorm() const;
  // Whether the last Step() updated nothing because its gradient norm was not finite
  // (options.skip_nonfinite).
  bool LastStepSkipped() const;
  // Offloaded chunks whose CPU update has already started in this step (during backward, when
  // max_grad_norm is 0); Step() resets it. What shows the optimizer overlapping backward.
  int UpdatesStartedBeforeStep() const;
  // [Speculative clipped updates] steps that speculated and, of those, steps whose updates were
  // restored and redone with the clip coefficient (or restored by ZeroGrad / a failed Step()).
  struct SpeculationCounts {
    int64_t speculated = 0;
    int64_t restored = 0;
  };
  SpeculationCounts Speculation() const;
  // Sharded: persistent chunks whose grads' all-reduce started during backward in this step (after
  // the group that completes them, in the last micro-batch); Step() resets it.
  int PersistentReducesInBackward() const;
  // Sharded: offloaded chunks' reduce-scatters of this step that ran beside a later group's
  // backward (finished at that group's hook, not where they were issued); Step() resets it.
  int ShardReducesBesideBackward() const;

  // Unique parameters in canonical order (first appearance in the groups); the order the
  // reference path must pass to clip_grad_norm_ and AdamW for bit-identical results.
  std::vector<NamedParam> ParamOrder() const;
  // Full parameter values in the model dtype, as CPU tensors, in ParamOrder(). Sharded, these three
  // gather every rank's shards (a collective: every rank calls it; a failed collective throws
  // c10::Error with the failure's message).
  std::vector<NamedParam> Params();
  // Sharded, Grads() also sums the persistent chunks' grads over the ranks (Step() then does not):
  // call it after the step's last micro-batch only.
  // Accumulated gradients of the current step as CPU tensors (offloaded chunks: fp32 for adamw and
  // sgd, the model dtype for adamw_bf16 and adamw8bit).
  std::vector<NamedParam> Grads();
  // "<name>.exp_avg", "<name>.exp_avg_sq" (fp32 for adamw, the model dtype for adamw_bf16, none
  // for sgd; adamw8bit: "<name>.exp_avg.q8" / ".exp_avg_sq.q8" uint8 codes of the parameter's
  // shape and "<name>.exp_avg.absmax" / ".exp_avg_sq.absmax" fp32 per 256 elements, see
  // [8-bit optimizer state]), "<name>.master" (fp32, when the optimizer keeps one) and "step"
  // (int64 scalar), as
  // CPU tensors; parameters never updated are left out (like torch's AdamW, which has no state
  // for them), and an empty vector before the first step (always for sgd on an fp32 model).
  std::vector<NamedParam> OptimizerState();
  // Restores values (by name, tied aliases accepted; every parameter required) and optionally the
  // optimizer state in the OptimizerState() format (empty = keep the current state; a parameter
  // without moments starts fresh).
  absl::Status LoadParamsAndState(const std::vector<NamedParam>& params,
                                  const std::vector<NamedParam>& state);

  // [Per-rank checkpoint pieces] What this rank stores of each tensor, without a collective:
  // flat element ranges of the parameters and, after the first update, of their optimizer state
  // ("<name>", "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.master" as in OptimizerState(),
  // plus "step" on rank 0). An offloaded parameter's range is this rank's shard of it; a
  // persistent (replicated) one is split evenly over the ranks. Over all ranks the pieces of a
  // tensor tile it exactly once. Not for adamw8bit (block-quantized state) or stateless managers:
  // UNIMPLEMENTED. The values are contiguous views of the manager's own storage (host arrays, or
  // the device tensors of persistent chunks), valid until it next trains or loads: written one at
  // a time, they add one piece to host memory, not the rank's share.
  absl::StatusOr<std::vector<TensorPiece>> LocalPieces();
  // Reads elements [begin, begin + len) of a flattened tensor by name (any floating dtype; "step"
  // as int64); NOT_FOUND when the tensor is absent.
  using RangeReader = std::function<absl::StatusOr<torch::Tensor>(const std::string& name,
                                                                  int64_t begin, int64_t len)>;
  // Loads this rank's parameters and, when `with_state`, optimizer state through `read`, reading
  // only what this rank stores (its shards; whole persistent parameters): the counterpart of
  // LocalPieces() for any world size and layout. A parameter without "<name>.exp_avg" starts
  // fresh (step 0). [Byte chunks] too: `read` gives a parameter's elements in its own dtype (QLoRA's
  // NF4 parts in uint8 and fp32), whole elements around a shard boundary that cuts one.
  // `parallel_reads` > 1: up to that many parameters' values are read at once on worker threads
  // (`read` must then be thread-safe), together at most 1 GiB of whole fp32 parameters beyond the
  // first; installing stays in order on the calling thread.
  absl::Status LoadRanges(const RangeReader& read, bool with_state, int parallel_reads = 1);

  ChunkMemoryStats MemoryStats() const;
  // The CPU passes that finished since the last call (CpuPassStats); resets the counters. With
  // [Deferred CPU updates] a step's updates finish during the next one, so per-step figures are
  // what finished in the step's interval.
  CpuPassStats TakeCpuPassStats();
  // Uploads since creation or the last ResetUploadStats(); waits for the uploads still in flight.
  ChunkUploadStats UploadStats();
  void ResetUploadStats();
  // Buffers needed so that every group's non-persistent chunks fit on the device at once.
  int MinBuffers() const;

  class Impl;

 private:
  explicit ChunkManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace memplan
