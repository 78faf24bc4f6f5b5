// ChunkOptimizer: gradients and the optimizer, above the ChunkSet, the ChunkCollectives and the
// ChunkPager. Owns the gradient staging (device grad slots, host staging and sums, the sharded
// flat fp32 grads), the optimizer state (device state of persistent chunks, host state of
// offloaded ones), the CPU workers and the step. Promise: Step() leaves every parameter as
// torch's optimizer would after the same gradients (README.md, "Bit-exactness"); a collective
// that failed during the step's hooks fails Step(). Not thread-safe (it runs its own CPU
// workers). Private to agent/chunks.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "agent/chunks/adamw8bit_torch.h"
#include "agent/chunks/chunk_collectives.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/chunks/chunk_pager.h"
#include "agent/chunks/chunk_set.h"
#include "agent/chunks/chunk_streams.h"
#include "agent/chunks/host_buffer.h"
#include "agent/chunks/thread_pool.h"
#include "agent/core/torch_pch.h"
#include "common/optimizer_bytes.h"

namespace memplan::chunks {

// A parameter's gradient bookkeeping and optimizer state.
struct ParamState {
  bool in_flat = false;  // sharded: its grad is in the chunk's grad_flat this micro-batch
  int64_t step = 0;      // updates applied (torch's AdamW keeps one count per parameter)
  bool grad_in_step = false;
  bool grad_this_micro = false;
  torch::Tensor grad_norm;  // L2 norm of the final grad, computed where the grad lives
  // Persistent chunks: optimizer state on the device (views into the chunk's flat state).
  torch::Tensor master;   // fp32 copy when OptimizerKeepsMaster()
  torch::Tensor exp_avg;  // moments: fp32 (adamw) or the model dtype (adamw_bf16); none for sgd
  torch::Tensor exp_avg_sq;
  // adamw8bit: the absmax of each of its 256-element blocks, strided views into the chunk's slots
  // ([8-bit optimizer state]); the moments above are then uint8 codes.
  torch::Tensor exp_avg_absmax, exp_avg_sq_absmax;
};

// A chunk's gradients and optimizer state.
struct ChunkState {
  torch::Tensor grad_flat;  // sharded: the micro-batch's grads of the chunk on the device
  // Sharded, when one reduce-scatter carries the step's whole gradient (one micro-batch, or the
  // sum kept on the device): the squared L2 norm of this rank's shard as the update will read it,
  // float64 on the device, so that clipping needs no pass over host memory.
  torch::Tensor shard_squares;
  // Persistent: flat optimizer state over the chunk's span (common/optimizer_bytes.h).
  torch::Tensor device_master, device_exp_avg, device_exp_avg_sq;
  torch::Tensor device_exp_avg_absmax, device_exp_avg_sq_absmax;  // adamw8bit slots
  // Non-persistent: host arrays laid out like the chunk (element offsets of the layout), sized by
  // OffloadedChunkHost() (common/optimizer_bytes.h).
  HostBuffer grad_stage;  // model dtype; where grads land from the device
  HostBuffer master;      // fp32, when OptimizerKeepsMaster()
  HostBuffer grad_accum;  // grad sum over micro-batches (GradSumElemBytes), unless grad_stage is it
  HostBuffer exp_avg;     // moments in OptimizerMomentElemBytes
  HostBuffer exp_avg_sq;
  HostBuffer exp_avg_absmax;  // adamw8bit: QuantAbsmaxSlots() fp32 slots of this shard
  HostBuffer exp_avg_sq_absmax;
  // [Speculative clipped updates]: second copies of what the update writes, laid out as the
  // arrays they stand for (the master, or the parameters, in copy_target; pinned like
  // param_host when they are the parameters); a speculative update writes these, and whether
  // this step's update of the chunk did.
  HostBuffer copy_target, copy_exp_avg, copy_exp_avg_sq;
  HostBuffer copy_exp_avg_absmax, copy_exp_avg_sq_absmax;
  bool speculative = false;
  // [Device updates of offloaded chunks]: Step() updates this chunk on the device (its host
  // arrays are pinned); the host copies of that update finish at device_done.
  bool device_update = false;
  EventPtr device_done;
  int micro_batches = 0;  // micro-batches whose grads arrived in this step
  // Sharded, persistent: this step's grads are all-reduced (started in backward, or in Step).
  bool grads_reduced = false;
  // [Sharded persistent state]: this step's reduced grads of its shard (model dtype, on the
  // device) once the reduce-scatter finished.
  torch::Tensor grad_shard;
  bool update_started = false;
  EventPtr grads_copied;  // the device-to-host copy of this micro-batch's grads
  std::unique_ptr<TaskTracker> tasks = std::make_unique<TaskTracker>();
};

class ChunkOptimizer {
 public:
  // The collaborators outlive the optimizer.
  ChunkOptimizer(ChunkSet& set, ChunkStreams& streams, ChunkCollectives& collectives,
                 ChunkPager& pager);

  // Before ChunkSet::Init: the adamw8bit maps on the device.
  void PrepareInit();
  // ChunkSet::ChunkStored: chunk c's optimizer state and gradient staging.
  absl::Status InitChunk(int c);
  // [Grad staging slots]: after ChunkSet::Init.
  absl::Status InitGradSlots();
  void AddStats(ChunkMemoryStats& stats) const;

  // Before block group g's backward: its offloaded parameters' grads view a slot.
  void AssignGradSlots(int group);
  void PostBackward(int group);
  // ChunkCollectives' callbacks.
  void OnShardStaged(const ChunkCollectives::ShardStaged& staged);
  void OnStateShardReduced(int c, const torch::Tensor& sum);

  absl::Status Step(double max_grad_norm);
  void ZeroGrad();
  // Finishes everything in flight: reduce-scatters, gathers, side streams, CPU work.
  void WaitAll() { WaitInFlight(/*started_updates=*/true); }
  // Waits for the CPU work on chunk c, and for its device update's copies back
  // (ChunkPager::HostWritesFn).
  void WaitTasks(int c);
  void WaitAllTasks() {
    for (ChunkState& chunk : chunks_) chunk.tasks->Wait();
  }
  // Sharded: sums the replicated persistent chunks' grads over the ranks (once per step).
  absl::Status AllReducePersistentGrads();

  ParamState& state(int i) { return params_[i]; }
  ChunkState& chunk_state(int c) { return chunks_[c]; }
  OptimizerKind optimizer() const { return set_.options().optimizer; }
  // The update runs on an fp32 master (adamw and sgd on bf16 parameters).
  bool master() const { return OptimizerKeepsMaster(optimizer(), set_.elem_size()); }
  // adamw_bf16: parameters, grads and moments in the model dtype, at::_fused_adamw_ on them.
  bool pure() const { return optimizer() == OptimizerKind::kAdamWBf16States; }
  bool has_moments() const { return OptimizerMoments(optimizer()) > 0; }
  // adamw8bit: uint8 moments with absmax slots, no master ([8-bit optimizer state]).
  bool quantized() const { return optimizer() == OptimizerKind::kAdamW8bit; }
  torch::ScalarType moment_dtype() const {
    return quantized() ? torch::kUInt8 : pure() ? set_.dtype() : torch::kFloat32;
  }
  // The dtype of an offloaded chunk's grad as the update reads it (HostGrad()).
  // adamw / sgd: fp32 (the fp32 sum, or the staging copy of an fp32 model); adamw_bf16 and
  // adamw8bit: the model dtype (summed as torch sums .grad).
  torch::ScalarType host_grad_dtype() const {
    return pure() || quantized() ? set_.dtype() : torch::kFloat32;
  }
  int64_t slot_elems() const { return QuantSlotElems(set_.elem_size()); }
  float* HostMaster(int c) {
    return master() ? chunks_[c].master.as<float>() : set_.chunk(c).param_host.as<float>();
  }
  // The grad the update reads: the sum over micro-batches, or the staging copy when there is no
  // separate sum (one micro-batch without master); its dtype is host_grad_dtype().
  void* HostGrad(int c) {
    ChunkState& chunk = chunks_[c];
    return chunk.grad_accum.data() != nullptr ? chunk.grad_accum.data() : chunk.grad_stage.data();
  }

  double LastGradNorm() const { return last_grad_norm_; }
  bool LastStepSkipped() const { return last_step_skipped_; }
  int UpdatesStartedBeforeStep() const;
  ChunkManager::SpeculationCounts Speculation() const { return speculation_; }
  CpuPassStats TakeCpuPassStats();
  int PersistentReducesInBackward() const { return reduces_in_backward_; }
  int ShardReducesBesideBackward() const { return reduces_beside_backward_; }

 private:
  class PersistentUpdate;

  void StageGrad(int i);
  bool InGradSlot(const torch::Tensor& grad) const;
  // [Grad copy backlog] After a group's grads were queued for the host (`touched` chunks): keep
  // at most options.max_grad_copy_groups groups of copies in flight.
  void BoundGradCopyBacklog(const std::set<int>& touched);
  void PostBackwardSharded(int group);
  // [Persistent all-reduce in backward] / [State reduce-scatter per group]
  absl::Status StartPersistentReduce(int c);
  absl::StatusOr<double> ShardedSquaredNorm();
  // The replicated persistent parameters `updated` (in chunk order) take their fp32 masters.
  void CopyMastersToParams(const std::vector<int>& updated);
  // [Sharded persistent state]: the step's updates of the shards and the all-gathers after them.
  absl::Status UpdateShardedPersistent(const torch::Tensor& clip_coef, float grad_scale);
  // [Speculative clipped updates] how a range's task uses the second copies: kSpeculate updates
  // into them (each piece copied there from the live arrays first); kRedoOrDrop with an update
  // redoes it the same way with the same step count; kRedoOrDrop without one drops the speculation
  // (the step count is taken back, the parameters rounded again from a master).
  enum class Copies { kNone, kSpeculate, kRedoOrDrop };
  // Accumulates chunk c's staged grads and/or updates it on the CPU workers.
  void ScheduleChunkWork(int c, bool accumulate, bool update, float grad_scale,
                         Copies copies = Copies::kNone);
  // Options and layout allow speculation (the second copies are allocated).
  bool SpeculationEnabled() const;
  // Waits for every CPU task, then for the chunks updated speculatively this step: with `redo`
  // updates them again with `grad_scale` (left running as Step()'s own updates are), else drops
  // the speculative values and waits for that.
  void RedoOrDropSpeculation(bool redo, float grad_scale);
  // At the end of a Step() that stands: each speculative chunk's second copies and its live
  // arrays trade places.
  void CommitSpeculation();
  // Step()'s updates of the offloaded chunks that did not start in backward, in chunk order: on
  // the CPU workers, or on the device for those marked device_update (`clip_coef`: Step()'s).
  void ScheduleStepUpdates(float grad_scale, const torch::Tensor& clip_coef);
  // A flat state array over a chunk's whole span (a persistent chunk's, a device slot's), at
  // parameter p: the view of p's elements in p's shape.
  static torch::Tensor ParamView(const torch::Tensor& flat, const Param& p) {
    return flat.narrow(0, p.offset_elems, p.numel).view(p.shape);
  }
  // adamw8bit: in flat absmax slots over a chunk's whole span, those of p's 256-element blocks.
  torch::Tensor QuantSlotsView(const torch::Tensor& flat, const Param& p) const;
  // [Device updates of offloaded chunks] (chunk_device_update.cc)
  bool DeviceUpdatesApply() const;
  bool DeviceUpdateChunk(int c) const;  // chunk c is one of the options' share
  // Queues the updates of `chunks` (in order) on the device; returns without waiting.
  void StartDeviceUpdates(const std::vector<int>& chunks, float grad_scale,
                          const torch::Tensor& clip_coef);
  // The host waits for every device update queued and releases the device slots.
  void FinishDeviceUpdates();
  bool AnyUpdateStarted() const;
  // WaitAll(), except that with `started_updates` false the CPU work of the chunks whose update
  // already started is left running ([Deferred CPU updates]: the pager waits for it per chunk).
  void WaitInFlight(bool started_updates);
  // Whether an offloaded chunk's CPU update may start as soon as its final grads arrive: only
  // when nothing is clipped and no non-finite check must see the whole step first.
  // [Speculative clipped updates]: or when this step speculates that it will not clip.
  bool UpdatesDuringBackward() const {
    return (set_.options().max_grad_norm == 0 || speculating_) && !set_.options().skip_nonfinite;
  }
  void ResetStep();

  ChunkSet& set_;
  ChunkStreams& streams_;
  ChunkCollectives& collectives_;
  ChunkPager& pager_;
  std::vector<ParamState> params_;  // per parameter of the set
  std::vector<ChunkState> chunks_;  // per chunk of the set
  ThreadPool pool_;
  QuantMapTensors quant_maps_;  // adamw8bit: the maps on the device, for persistent chunks
  int64_t persistent_state_device_bytes_ = 0;
  // [Grad staging slots] (common/chunk_packing.h): before block group g's backward, its
  // offloaded parameters get zeroed grads in slot g % kGradStagingSlots, which autograd then
  // accumulates into; the slot is reused once the copies out of its last use are done.
  std::vector<torch::Tensor> grad_slots_;  // kGradStagingSlots flat device tensors, or none
  std::vector<EventPtr> slot_copied_;      // per slot: recorded after its last use's copies
  std::vector<int64_t> slot_offset_;       // per parameter: elements into its slot, or -1
  std::vector<int64_t> group_slot_elems_;  // per group: the elements its parameters take
  int64_t grad_slot_device_bytes_ = 0;
  int64_t grads_from_slots_ = 0;        // ChunkMemoryStats::grads_from_slots
  std::deque<EventPtr> grad_copies_;    // [Grad copy backlog]: one event per group, oldest first
  bool persistent_reduced_ = false;     // this step's persistent grads are all-reduced already
  int reduces_in_backward_ = 0;         // persistent all-reduces started in backward this step
  int reduces_beside_backward_ = 0;     // reduce-scatters finished at a later group's hook
  // ChunkMemoryStats::state_reduce_device_bytes_by_group, per group (the latest step's).
  std::vector<int64_t> state_reduce_by_group_;
  double last_grad_norm_ = 0;
  bool last_step_skipped_ = false;  // [Non-finite steps]
  // [Speculative clipped updates]: this step's updates may start in backward; the last Step()
  // scaled the grads (true before the first one, which never speculates).
  bool speculating_ = false;
  bool last_step_clipped_ = true;
  ChunkManager::SpeculationCounts speculation_;
  bool overrun_ = false;  // grads arrived for a chunk whose update already started
  std::atomic<bool> worker_failed_{false};  // a CPU update threw (reported by Step())
  // TakeCpuPassStats(): added by the workers, in nanoseconds and elements.
  struct CpuPassCounters {
    std::atomic<int64_t> accumulate_ns{0};
    std::atomic<int64_t> update_ns{0};
    std::atomic<int64_t> accumulated{0};
    std::atomic<int64_t> updated{0};
  };
  CpuPassCounters cpu_passes_;
  // [Device updates of offloaded chunks]: the two slots chunks take turns in (allocated by the
  // step's first device update, released once the host has seen its last one finish), and the
  // chunk whose update is queued last.
  struct DeviceSlot {
    torch::Tensor param, grad, exp_avg, exp_avg_sq, exp_avg_absmax, exp_avg_sq_absmax;
    EventPtr free;  // the copies back out of the slot's previous chunk
  };
  std::vector<DeviceSlot> device_slots_;
  // The step's clip coefficient, a compute-stream tensor the side stream reads: held until the
  // host has seen the updates finish, so that the next forward cannot be handed its block.
  torch::Tensor device_clip_coef_;
  int last_device_chunk_ = -1;
  std::atomic<int64_t> device_updated_{0};
};

}  // namespace memplan::chunks
