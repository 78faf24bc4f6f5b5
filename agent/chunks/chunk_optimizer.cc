// ChunkOptimizer, part one: state allocation and the gradients' way from backward to the host
// (or, sharded, into the collectives). The step itself is chunk_optimizer_step.cc.
#include "agent/chunks/chunk_optimizer.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/core/foreach_groups.h"
#include "common/chunk_packing.h"
#include "common/log.h"
#include "common/optimizer_bytes.h"
#include "common/status.h"

#ifdef MEMPLAN_SHARD_MEAN_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "agent/chunks/shard_mean_kernel.h"
#include "agent/core/kernel_launch.h"
#endif

namespace memplan::chunks {

ChunkOptimizer::ChunkOptimizer(ChunkSet& set, ChunkStreams& streams,
                               ChunkCollectives& collectives, ChunkPager& pager)
    : set_(set),
      streams_(streams),
      collectives_(collectives),
      pager_(pager),
      pool_(std::max(0, set.options().cpu_threads)) {}

void ChunkOptimizer::PrepareInit() {
  params_.resize(set_.layout().slots().size());
  chunks_.resize(set_.layout().num_chunks());
  if (quantized() && !set_.options().profile_only) {
    quant_maps_ = MakeQuantMapTensors(set_.options().device);
  }
}

torch::Tensor ChunkOptimizer::QuantSlotsView(const torch::Tensor& flat, const Param& p) const {
  // Block k of the parameter starts at chunk element offset + 256 k: slot
  // (offset + 256 k) / slot_elems, a multiple of the alignment.
  const int64_t blocks = QuantBlockCount(p.numel);
  const int64_t first = p.offset_elems / slot_elems();
  const int64_t stride = kQuantBlockElems / slot_elems();
  return flat.slice(0, first, first + (blocks - 1) * stride + 1, stride);
}

absl::Status ChunkOptimizer::InitChunk(int c) {
  if (set_.stateless()) return absl::OkStatus();
  const Chunk& chunk = set_.chunk(c);
  ChunkState& state = chunks_[c];
  const int64_t elem_bytes = set_.elem_size();
  const ChunkManagerOptions& options = set_.options();
  if (chunk.persistent) {
    // Flat state over the whole span (alignment gaps included), exactly
    // PersistentStateBytesPerElem() per element; parameters' state are views into it.
    // [Sharded persistent state]: over this rank's shard of the padded span only.
    const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(options.device);
    const auto moments = fp32.dtype(moment_dtype());
    const int64_t state_elems = chunk.state_sharded ? chunk.shard_elems : chunk.span_elems;
    if (master()) {
      state.device_master =
          chunk.device.narrow(0, chunk.shard_begin, state_elems).to(torch::kFloat32);
    }
    if (has_moments()) {
      state.device_exp_avg = torch::zeros({state_elems}, moments);
      state.device_exp_avg_sq = torch::zeros({state_elems}, moments);
    }
    if (quantized()) {
      const int64_t slots = QuantAbsmaxSlots(chunk.span_elems, elem_bytes);
      state.device_exp_avg_absmax = torch::zeros({slots}, fp32);
      state.device_exp_avg_sq_absmax = torch::zeros({slots}, fp32);
    }
    for (int i : chunk.params) {
      const Param& p = set_.param(i);
      ParamState& s = params_[i];
      // Sharded state: a flat view of the parameter's part of the shard (none when this rank
      // stores none of it).
      const OwnedRange owned = chunk.state_sharded ? set_.Owned(p, chunk) : OwnedRange{};
      auto view = [&p, &chunk, owned](const torch::Tensor& flat) {
        if (chunk.state_sharded) {
          return owned.len > 0 ? flat.narrow(0, owned.at, owned.len) : torch::Tensor();
        }
        return ParamView(flat, p);
      };
      if (master()) s.master = view(state.device_master);
      if (has_moments()) {
        s.exp_avg = view(state.device_exp_avg);
        s.exp_avg_sq = view(state.device_exp_avg_sq);
      }
      if (quantized()) {
        s.exp_avg_absmax = QuantSlotsView(state.device_exp_avg_absmax, p);
        s.exp_avg_sq_absmax = QuantSlotsView(state.device_exp_avg_sq_absmax, p);
      }
    }
    persistent_state_device_bytes_ += PersistentStateBytes(optimizer(), elem_bytes, state_elems);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(state.grad_stage, set_.AllocateTransfer(chunk.shard_elems * elem_bytes));
  // The pageable state, as common/optimizer_bytes.h defines it for the planner (per element
  // of this rank's shard); pinned where [Device updates of offloaded chunks] copy it.
  state.device_update = DeviceUpdateChunk(c);
  auto state_buffer = [&](int64_t bytes) -> absl::StatusOr<HostBuffer> {
    if (!state.device_update) return HostBuffer::AllocatePageable(bytes);
    return set_.AllocateTransfer(bytes);
  };
  const int64_t span = chunk.shard_elems;
  if (master()) state.master = HostBuffer::AllocatePageable(span * 4);
  const int64_t grad_sum = GradSumElemBytes(optimizer(), elem_bytes, options.grad_accum);
  if (grad_sum > 0) {
    ASSIGN_OR_RETURN(state.grad_accum, state_buffer(span * grad_sum));
  }
  if (has_moments()) {
    const int64_t moment = OptimizerMomentElemBytes(optimizer(), elem_bytes);
    ASSIGN_OR_RETURN(state.exp_avg, state_buffer(span * moment));
    ASSIGN_OR_RETURN(state.exp_avg_sq, state_buffer(span * moment));
  }
  if (quantized()) {
    const int64_t slot_bytes = QuantAbsmaxBytes(optimizer(), elem_bytes, span) / 2;
    ASSIGN_OR_RETURN(state.exp_avg_absmax, state_buffer(slot_bytes));
    ASSIGN_OR_RETURN(state.exp_avg_sq_absmax, state_buffer(slot_bytes));
  }
  if (SpeculationEnabled()) {
    // [Speculative clipped updates]: SpeculationBackupBytes() (common/optimizer_bytes.h).
    // Without a master the parameters' copy takes turns with param_host as the upload source:
    // the same kind of memory.
    if (master()) {
      state.copy_target = HostBuffer::AllocatePageable(span * 4);
    } else {
      ASSIGN_OR_RETURN(state.copy_target, set_.AllocateTransfer(span * elem_bytes));
    }
    // The copies become the live arrays in turn: pinned alike.
    ASSIGN_OR_RETURN(state.copy_exp_avg, state_buffer(state.exp_avg.size_bytes()));
    ASSIGN_OR_RETURN(state.copy_exp_avg_sq, state_buffer(state.exp_avg_sq.size_bytes()));
    ASSIGN_OR_RETURN(state.copy_exp_avg_absmax, state_buffer(state.exp_avg_absmax.size_bytes()));
    ASSIGN_OR_RETURN(state.copy_exp_avg_sq_absmax,
                     state_buffer(state.exp_avg_sq_absmax.size_bytes()));
  }
  for (const HostBuffer* b : {&state.grad_stage, &state.grad_accum, &state.exp_avg,
                              &state.exp_avg_sq, &state.exp_avg_absmax, &state.exp_avg_sq_absmax}) {
    // Pinned memory ran out (pageable_fallback): the chunk's update stays on the CPU.
    if (set_.cuda() && b->data() != nullptr && !b->pinned()) state.device_update = false;
  }
  set_.CountHost(state.grad_stage);
  for (const HostBuffer* b :
       {&state.master, &state.grad_accum, &state.exp_avg, &state.exp_avg_sq, &state.exp_avg_absmax,
        &state.exp_avg_sq_absmax, &state.copy_target, &state.copy_exp_avg, &state.copy_exp_avg_sq,
        &state.copy_exp_avg_absmax, &state.copy_exp_avg_sq_absmax}) {
    set_.CountHost(*b);
  }
  if (!master()) return absl::OkStatus();
  // The master starts as the parameters' values (zeros with [Sharded loading]).
  for (int i : chunk.params) {
    const OwnedRange r = set_.Owned(set_.param(i), chunk);
    if (r.len == 0) continue;
    torch::Tensor dst = ChunkSet::HostFlat(state.master.data(), r.at, r.len, torch::kFloat32);
    if (options.deferred_values) {
      dst.zero_();
    } else {
      dst.copy_(ChunkSet::HostFlat(chunk.param_host.data(), r.at, r.len, set_.dtype()));
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkOptimizer::InitGradSlots() {
  // [Grad staging slots]: one rank, a full optimizer, something offloaded. Each block parameter
  // in an offloaded chunk takes GradSlotParamBytes in its first group's slot, the sizes the
  // planner prices (kGradStagingSlots x GradSlotBytesByFirstOffloaded).
  const ChunkPacking& layout = set_.layout();
  const int n_persist = set_.n_persist();
  if (set_.stateless() || set_.sharded() || n_persist >= layout.num_chunks()) {
    return absl::OkStatus();
  }
  const int64_t slot_bytes = layout.GradSlotBytesByFirstOffloaded()[n_persist];
  if (slot_bytes <= 0) return absl::OkStatus();
  const int64_t elem_bytes = set_.elem_size();
  // The offsets are the layout's (common/chunk_packing.h); the groups are the hooks' (the
  // last backward group of each parameter), which the check below holds to the layout's.
  const std::vector<int64_t> offsets = layout.GradSlotOffsets(n_persist);
  slot_offset_.assign(set_.num_params(), -1);
  group_slot_elems_.assign(set_.num_groups(), 0);
  int64_t largest = 0;
  for (int i = 0; i < set_.num_params(); ++i) {
    if (offsets[i] < 0) continue;
    const Param& p = set_.param(i);
    int64_t& end = group_slot_elems_[p.first_group];
    slot_offset_[i] = offsets[i] / elem_bytes;
    end = std::max(end, (offsets[i] + layout.GradSlotParamBytes(i)) / elem_bytes);
    largest = std::max(largest, end);
  }
  if (largest * elem_bytes != slot_bytes) {
    return absl::InternalError(absl::StrCat("grad staging slots: the parameters take ",
                                            largest * elem_bytes, " bytes, the layout says ",
                                            slot_bytes));
  }
  try {
    for (int k = 0; k < kGradStagingSlots; ++k) {
      grad_slots_.push_back(torch::empty({largest}, set_.DeviceOptions()));
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "allocating grad staging slots");
  }
  slot_copied_.assign(kGradStagingSlots, nullptr);
  grad_slot_device_bytes_ = kGradStagingSlots * slot_bytes;
  return absl::OkStatus();
}

void ChunkOptimizer::AddStats(ChunkMemoryStats& stats) const {
  stats.persistent_state_device_bytes = persistent_state_device_bytes_;
  stats.grad_slot_device_bytes = grad_slot_device_bytes_;
  stats.grads_from_slots = grads_from_slots_;
  stats.state_reduce_device_bytes_by_group = state_reduce_by_group_;
}

CpuPassStats ChunkOptimizer::TakeCpuPassStats() {
  CpuPassStats s;
  s.threads = pool_.num_threads();
  s.accumulate_thread_seconds =
      static_cast<double>(cpu_passes_.accumulate_ns.exchange(0)) * 1e-9;
  s.update_thread_seconds = static_cast<double>(cpu_passes_.update_ns.exchange(0)) * 1e-9;
  s.accumulated_elems = cpu_passes_.accumulated.exchange(0);
  s.updated_elems = cpu_passes_.updated.exchange(0);
  s.device_updated_elems = device_updated_.exchange(0);
  return s;
}

int ChunkOptimizer::UpdatesStartedBeforeStep() const {
  int n = 0;
  for (const ChunkState& chunk : chunks_) n += chunk.update_started ? 1 : 0;
  return n;
}

bool ChunkOptimizer::AnyUpdateStarted() const {
  bool started = false;
  for (const ChunkState& chunk : chunks_) started = started || chunk.update_started;
  return started;
}

void ChunkOptimizer::BoundGradCopyBacklog(const std::set<int>& touched) {
  // [Grad copy backlog] StageGrad frees each grad as soon as its device-to-host copy is queued
  // (recordStream): the caching allocator cannot reuse the block until the offload stream has
  // run the copy. The host enqueues backward groups well ahead of the GPU, and every group it
  // is ahead by leaves that group's grads freed but not reusable (their copies have not even
  // started): on an H200, llama-3.2-3b 7x1536 with 105 of 113 chunks offloaded, the host ran ~7
  // groups ahead and 1.4 GiB of freed grads (7 x 192 MiB) stayed pending through backward, which
  // the allocator covered with new segments. Waiting on the host for the copies of the group
  // max_grad_copy_groups back bounds that run-ahead, as the activation offloader bounds its
  // forward copies (a stream-side wait does not: it orders the GPU, not the host). The GPU still
  // has the groups in between queued, so it costs time only where the copies are the slower side,
  // and then the step waits for them at its end anyway (the CPU update needs them on the host).
  if (!set_.cuda() || touched.empty()) return;
  grad_copies_.push_back(chunks_[*touched.rbegin()].grads_copied);  // recorded after them all
  while (static_cast<int>(grad_copies_.size()) > set_.options().max_grad_copy_groups) {
    if (grad_copies_.front()) grad_copies_.front()->synchronize();
    grad_copies_.pop_front();
  }
}

void ChunkOptimizer::StageGrad(int i) {
  Param& p = set_.param(i);
  ParamState& s = params_[i];
  ChunkState& chunk = chunks_[p.chunk];
  torch::Tensor grad = p.tensor.grad();
  if (!grad.defined()) return;
  s.grad_this_micro = true;
  // With one micro-batch the device grad is the final one: its norm is exactly what
  // clip_grad_norm_ computes, and on a GPU it costs no host work.
  if (set_.options().grad_accum == 1) s.grad_norm = grad.norm(2.0);
  torch::Tensor dst = ChunkSet::HostView(chunk.grad_stage.data(), p.offset_elems, p.shape,
                                         p.numel, set_.dtype());
  const bool from_slot = InGradSlot(grad);
  if (from_slot) ++grads_from_slots_;
#ifdef MEMPLAN_CHUNKS_CUDA
  if (set_.cuda()) {
    streams_.RecordOnCompute()->block(streams_.offload());
    {
      c10::cuda::CUDAStreamGuard guard(streams_.offload());
      dst.copy_(grad, /*non_blocking=*/true);
    }
    // The grad is freed below while the copy may still run on the offload stream (a slot is
    // not: it is reused only after the copies out of it, AssignGradSlots).
    if (!from_slot) {
      c10::cuda::CUDACachingAllocator::recordStream(grad.storage().data_ptr(), streams_.offload());
    }
    p.tensor.mutable_grad().reset();
    return;
  }
#endif
  dst.copy_(grad);
  p.tensor.mutable_grad().reset();
}

bool ChunkOptimizer::InGradSlot(const torch::Tensor& grad) const {
  for (const torch::Tensor& slot : grad_slots_) {
    if (grad.storage().is_alias_of(slot.storage())) return true;
  }
  return false;
}

void ChunkOptimizer::AssignGradSlots(int group) {
  if (grad_slots_.empty() || group_slot_elems_[group] == 0) return;
  const int k = group % kGradStagingSlots;
  // The slot's previous group's grads must be on their way out: the compute stream waits for
  // those copies (recorded on the offload stream in PostBackward) before zeroing it.
  streams_.WaitOnCompute(slot_copied_[k]);
  const torch::Tensor& slot = grad_slots_[k];
  for (int i : set_.group_params(group)) {
    Param& p = set_.param(i);
    // A grad that exists already came from a later group (a parameter several groups use), or
    // from this group's hook running before (it is zeroed only when assigned): it stays.
    if (slot_offset_[i] < 0 || p.first_group != group || !p.tensor.requires_grad() ||
        p.tensor.grad().defined()) {
      continue;
    }
    p.tensor.mutable_grad() = slot.narrow(0, slot_offset_[i], p.numel).view(p.shape).zero_();
  }
}

void ChunkOptimizer::PostBackward(int group) {
  if (group < 0 || group >= set_.num_groups()) {
    MEMPLAN_LOG(kError, "chunk manager hook for an unknown group").Field("group", group);
    return;
  }
  torch::NoGradGuard no_grad;
  if (set_.stateless()) {
    for (int i : set_.group_stage(group)) {
      Param& p = set_.param(i);
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
    }
    return;
  }
  if (set_.sharded()) {
    PostBackwardSharded(group);
    return;
  }
  std::set<int> touched;
  for (int i : set_.group_stage(group)) {
    const Param& p = set_.param(i);
    if (set_.chunk(p.chunk).persistent) continue;  // autograd accumulates these on the device
    // The staging area is reused: the accumulation of what it held before must be done.
    if (touched.insert(p.chunk).second) chunks_[p.chunk].tasks->Wait();
    StageGrad(i);
  }
  for (int c : touched) {
    ChunkState& chunk = chunks_[c];
#ifdef MEMPLAN_CHUNKS_CUDA
    if (set_.cuda()) {
      chunk.grads_copied = std::make_shared<Event>();
      chunk.grads_copied->record(streams_.offload());
    }
#else
    (void)chunk;
#endif
  }
  // [Grad staging slots] the copies out of this group's slot are the ones just queued.
  if (!grad_slots_.empty() && group_slot_elems_[group] > 0 && !touched.empty()) {
    slot_copied_[group % kGradStagingSlots] = chunks_[*touched.rbegin()].grads_copied;
  }
  BoundGradCopyBacklog(touched);
  const ChunkManagerOptions& options = set_.options();
  for (int c : touched) {
    ChunkState& chunk = chunks_[c];
    if (chunk.update_started) {
      overrun_ = true;
      continue;
    }
    const bool complete = set_.chunk(c).completion_group == group;
    if (complete) ++chunk.micro_batches;
    // Without clipping the update needs nothing but this chunk's final grads, so it overlaps the
    // rest of backward. With clipping it must wait for the global norm (end of backward, in
    // Step()): the CPU then only accumulates now.
    const bool update_now =
        complete && chunk.micro_batches >= options.grad_accum && UpdatesDuringBackward();
    ScheduleChunkWork(c, /*accumulate=*/true, update_now, 1.0f,
                      update_now && speculating_ ? Copies::kSpeculate : Copies::kNone);
  }
}

void ChunkOptimizer::PostBackwardSharded(int group) {
  // [Reduce-scatter in backward] The previous group's reduce-scatters ran beside this group's
  // backward: finish them before this group's grads are read.
  reduces_beside_backward_ += collectives_.pending_shard_reduces();
  if (const absl::Status s = collectives_.FinishShardReduces(); !s.ok()) {
    collectives_.FailCollective(s);
  }
  // [State reduce-scatter per group] Likewise the persistent chunks' reduce-scatters of the
  // previous group.
  if (const absl::Status s = collectives_.FinishStateReduces(); !s.ok()) {
    collectives_.FailCollective(s);
  }
  const ChunkManagerOptions& options = set_.options();
  std::set<int> touched, persistent_touched;
  for (int i : set_.group_stage(group)) {
    Param& p = set_.param(i);
    ParamState& s = params_[i];
    const Chunk& layout = set_.chunk(p.chunk);
    ChunkState& chunk = chunks_[p.chunk];
    if (layout.persistent) {
      persistent_touched.insert(p.chunk);
      continue;
    }
    touched.insert(p.chunk);
    torch::Tensor grad = p.tensor.grad();
    if (!grad.defined()) continue;
    s.grad_this_micro = true;
    if (!chunk.grad_flat.defined()) {
      // fp32 whatever the model dtype: the reduction over the ranks runs in fp32.
      chunk.grad_flat =
          torch::zeros({layout.padded_elems}, set_.DeviceOptions().dtype(torch::kFloat32));
    }
    torch::Tensor dst = chunk.grad_flat.narrow(0, p.offset_elems, p.numel).view(p.shape);
    // A tied weight's second contribution in this micro-batch (grad_accum > 1) adds on.
    if (s.in_flat) {
      dst.add_(grad);
    } else {
      dst.copy_(grad);
    }
    s.in_flat = true;
    p.tensor.mutable_grad().reset();
  }
  for (int c : touched) {
    const Chunk& layout = set_.chunk(c);
    ChunkState& chunk = chunks_[c];
    if (layout.completion_group != group || !chunk.grad_flat.defined()) continue;
    if (chunk.update_started) {
      overrun_ = true;
      chunk.grad_flat = torch::Tensor();
      for (int i : layout.params) params_[i].in_flat = false;
      continue;
    }
    if (options.accumulate_sharded_grads_on_device &&
        chunk.micro_batches + 1 < options.grad_accum) {
      // Keep grad_flat and the params' in_flat: the next micro-batch adds to them.
      ++chunk.micro_batches;
      continue;
    }
    chunk.tasks->Wait();  // the staging area is reused
    const bool whole_step =
        (options.grad_accum == 1 || options.accumulate_sharded_grads_on_device) &&
        chunk.micro_batches + 1 >= options.grad_accum;
    ++chunk.micro_batches;
    const bool update_now =
        chunk.micro_batches >= options.grad_accum && UpdatesDuringBackward();
    // The flat grads go with the collective; the next micro-batch starts a new one.
    torch::Tensor grad_flat = std::move(chunk.grad_flat);
    chunk.grad_flat = torch::Tensor();
    for (int i : layout.params) params_[i].in_flat = false;
    collectives_.StartShardReduce(
        c, std::move(grad_flat),
        ChunkSet::HostFlat(chunk.grad_stage.data(), 0, layout.shard_elems, set_.dtype()),
        whole_step, update_now);
  }
  // [Persistent all-reduce in backward] A persistent chunk whose last group ran in the step's
  // last micro-batch has its final grads: its all-reduce starts now, beside the rest of backward.
  for (int c : persistent_touched) {
    ChunkState& chunk = chunks_[c];
    if (set_.chunk(c).completion_group != group || chunk.grads_reduced) continue;
    if (++chunk.micro_batches < options.grad_accum) continue;
    const absl::Status s = StartPersistentReduce(c);
    if (!s.ok()) collectives_.FailCollective(s);
    ++reduces_in_backward_;
  }
  // What stays in flight beside the next group's backward (or up to the step after group 0).
  if (state_reduce_by_group_.empty()) state_reduce_by_group_.assign(set_.num_groups(), 0);
  state_reduce_by_group_[group] = collectives_.state_reduce_bytes();
}

void ChunkOptimizer::OnShardStaged(const ChunkCollectives::ShardStaged& staged) {
  ChunkState& chunk = chunks_[staged.chunk];
  if (staged.squares.defined()) chunk.shard_squares = staged.squares;
  if (set_.cuda()) chunk.grads_copied = staged.copied;
  ScheduleChunkWork(staged.chunk, /*accumulate=*/true, staged.update_now, 1.0f);
}

void ChunkOptimizer::OnStateShardReduced(int c, const torch::Tensor& sum) {
  // [Sharded persistent state]: the mean over the ranks, rounded once to the model dtype, and its
  // squares.
  ChunkState& chunk = chunks_[c];
#ifdef MEMPLAN_SHARD_MEAN_CUDA
  // A 16-bit model on the GPU: one kernel for the ops below (shard_mean_kernel.h).
  if (sum.is_cuda() && sum.is_contiguous() &&
      (set_.dtype() == torch::kBFloat16 || set_.dtype() == torch::kHalf)) {
    const c10::cuda::CUDAGuard guard(sum.device());
    chunk.grad_shard = torch::empty(sum.sizes(), sum.options().dtype(set_.dtype()));
    torch::Tensor partials = torch::empty({chunks_cuda::ShardMeanPartials(sum.numel())},
                                          sum.options().dtype(torch::kFloat64));
    cuda::CheckLaunch(chunks_cuda::LaunchShardMean(
                          sum.data_ptr<float>(), sum.numel(), set_.world(),
                          *cuda::KernelDtypeOf(chunk.grad_shard), chunk.grad_shard.data_ptr(),
                          partials.data_ptr<double>(), cuda::CurrentStream(sum)),
                      "shard mean");
    chunk.shard_squares = partials.sum();
    return;
  }
#endif
  torch::Tensor mean = sum;
  mean.div_(set_.world());
  chunk.grad_shard = set_.dtype() == torch::kFloat32 ? mean : mean.to(set_.dtype());
  chunk.shard_squares = chunk.grad_shard.to(torch::kFloat64).pow(2).sum();
}

absl::Status ChunkOptimizer::StartPersistentReduce(int c) {
  const Chunk& layout = set_.chunk(c);
  ChunkState& chunk = chunks_[c];
  if (layout.state_sharded) {
    // [Sharded persistent state]: the grads at their layout offsets in a flat tensor over the
    // padded chunk (alignment gaps and padding zeroed, nothing else written twice),
    // reduce-scattered into an fp32 shard; the parameters' own grads are not needed any more.
    // The flat is in the model dtype ([Narrow reduce-scatter]: a 16-bit grad widens exactly, and
    // the sum runs in fp32 either way). The chunks a group completes are all in flight together
    // and finish at the next group's hook, beside that group's backward ([State reduce-scatter
    // per group]).
    chunk.grads_reduced = true;
    bool any = false;
    for (int i : layout.params) any = any || set_.param(i).tensor.grad().defined();
    if (!any) return absl::OkStatus();
    // Every grad in the chunk's 16-bit dtype.
    bool narrow = set_.dtype() == torch::kBFloat16 || set_.dtype() == torch::kHalf;
    for (int i : layout.params) narrow = narrow && set_.param(i).dtype == set_.dtype();
    torch::Tensor flat = torch::empty(
        {layout.padded_elems}, set_.DeviceOptions().dtype(narrow ? set_.dtype() : torch::kFloat32));
    std::vector<int> by_offset = layout.params;
    std::sort(by_offset.begin(), by_offset.end(), [this](int a, int b) {
      return set_.param(a).offset_elems < set_.param(b).offset_elems;
    });
    int64_t covered = 0;  // elements written so far, from the start of the chunk
    std::vector<torch::Tensor> dst, src;
    for (int i : by_offset) {
      Param& p = set_.param(i);
      if (p.offset_elems > covered) flat.narrow(0, covered, p.offset_elems - covered).zero_();
      torch::Tensor slice = flat.narrow(0, p.offset_elems, p.numel);
      if (p.tensor.grad().defined()) {
        dst.push_back(slice);
        src.push_back(p.tensor.grad().reshape({-1}));
        params_[i].grad_in_step = true;
      } else {
        slice.zero_();
      }
      covered = p.offset_elems + p.numel;
    }
    if (layout.padded_elems > covered) {
      flat.narrow(0, covered, layout.padded_elems - covered).zero_();
    }
    ForeachCopy(dst, src);
    for (int i : by_offset) set_.param(i).tensor.mutable_grad().reset();
    collectives_.StartStateReduceScatter(c, std::move(flat));
    return absl::OkStatus();
  }
  // The previous one finishes first: one fp32 copy in flight besides the one being made.
  RETURN_IF_ERROR(collectives_.FinishPersistentReduce());
  chunk.grads_reduced = true;
  std::vector<torch::Tensor> grads;
  int64_t numel = 0;
  for (int i : layout.params) {
    const Param& p = set_.param(i);
    if (p.tensor.grad().defined()) {
      grads.push_back(p.tensor.grad());
      numel += grads.back().numel();
    }
  }
  if (grads.empty()) return absl::OkStatus();
  // Reduced in fp32 whatever the model dtype, each grad widened straight into its slice.
  torch::Tensor flat = torch::empty({numel}, set_.DeviceOptions().dtype(torch::kFloat32));
  std::vector<torch::Tensor> dst, src;
  int64_t at = 0;
  for (const torch::Tensor& g : grads) {
    dst.push_back(flat.narrow(0, at, g.numel()));
    src.push_back(g.reshape({-1}));
    at += g.numel();
  }
  ForeachCopy(dst, src);
  collectives_.StartAllReduce(std::move(flat), std::move(grads));
  return absl::OkStatus();
}

absl::Status ChunkOptimizer::AllReducePersistentGrads() {
  if (persistent_reduced_) return absl::OkStatus();
  persistent_reduced_ = true;
  // The chunks that completed in backward are in flight or done; the others (grads that arrived
  // in fewer micro-batches than grad_accum, or Grads() called mid-step) are reduced here, in
  // chunk order on every rank.
  for (int c = 0; c < set_.n_persist(); ++c) {
    if (chunks_[c].grads_reduced) continue;
    RETURN_IF_ERROR(StartPersistentReduce(c));
  }
  return collectives_.FinishPersistentReduce();
}

void ChunkOptimizer::WaitInFlight(bool started_updates) {
  (void)collectives_.FinishShardReduces();  // a failure is kept for Step()
  pager_.FinishGathers();
  streams_.Synchronize();
  for (ChunkState& chunk : chunks_) {
    if (started_updates || !chunk.update_started) chunk.tasks->Wait();
  }
  if (started_updates) FinishDeviceUpdates();
}

void ChunkOptimizer::WaitTasks(int c) {
  ChunkState& chunk = chunks_[c];
  chunk.tasks->Wait();
  if (chunk.device_done == nullptr) return;
  if (c == last_device_chunk_) {
    FinishDeviceUpdates();  // the step's last one: the slots go back to the allocator
  } else {
    chunk.device_done->synchronize();
  }
}

bool ChunkOptimizer::SpeculationEnabled() const {
  const ChunkManagerOptions& o = set_.options();
  return o.speculative_clip && !set_.stateless() && !set_.sharded() &&
         SpeculationApplies(o.max_grad_norm != 0, set_.world(), o.grad_accum, o.skip_nonfinite);
}

void ChunkOptimizer::RedoOrDropSpeculation(bool redo, float grad_scale) {
  WaitAllTasks();
  bool any = false;
  for (int c = set_.n_persist(); c < set_.num_chunks(); ++c) {
    if (!chunks_[c].speculative) continue;
    any = true;
    ScheduleChunkWork(c, /*accumulate=*/false, redo, grad_scale, Copies::kRedoOrDrop);
  }
  if (any) ++speculation_.restored;
  if (!redo) WaitAllTasks();
}

void ChunkOptimizer::CommitSpeculation() {
  for (int c = set_.n_persist(); c < set_.num_chunks(); ++c) {
    ChunkState& chunk = chunks_[c];
    if (!chunk.speculative) continue;
    // The tasks still running write through the pointers they were given, into what becomes the
    // live arrays here; whatever reads those waits for the chunk's tasks first.
    std::swap(master() ? chunk.master : set_.chunk(c).param_host, chunk.copy_target);
    std::swap(chunk.exp_avg, chunk.copy_exp_avg);
    std::swap(chunk.exp_avg_sq, chunk.copy_exp_avg_sq);
    std::swap(chunk.exp_avg_absmax, chunk.copy_exp_avg_absmax);
    std::swap(chunk.exp_avg_sq_absmax, chunk.copy_exp_avg_sq_absmax);
    chunk.speculative = false;
  }
}

void ChunkOptimizer::ResetStep() {
  for (int i = 0; i < set_.num_params(); ++i) {
    Param& p = set_.param(i);
    ParamState& s = params_[i];
    if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
    s.grad_in_step = false;
    s.grad_this_micro = false;
    s.in_flat = false;
    s.grad_norm = torch::Tensor();
  }
  persistent_reduced_ = false;
  collectives_.ResetStep();
  reduces_in_backward_ = 0;
  reduces_beside_backward_ = 0;
  for (ChunkState& chunk : chunks_) {
    chunk.grad_flat = torch::Tensor();
    chunk.grad_shard = torch::Tensor();
    chunk.shard_squares = torch::Tensor();
    chunk.micro_batches = 0;
    chunk.grads_reduced = false;
    chunk.update_started = false;
    chunk.speculative = false;
    chunk.grads_copied = nullptr;
  }
  overrun_ = false;
  speculating_ = !last_step_clipped_ && SpeculationEnabled();
}

void ChunkOptimizer::ZeroGrad() {
  WaitAll();
  RedoOrDropSpeculation(/*redo=*/false, 1.0f);  // the step never happened
  if (AnyUpdateStarted()) pager_.InvalidateBuffers();
  ResetStep();
}

}  // namespace memplan::chunks
