// ChunkOptimizer, part two: the updates. The CPU workers' accumulation and update of offloaded
// chunks, [Persistent update] on the device, the sharded persistent state's update and Step().
#include "agent/chunks/chunk_optimizer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/chunks/adamw8bit_torch.h"
#include "agent/chunks/chunk_persistent_update.h"
#include "agent/chunks/cpu_adamw.h"
#include "agent/chunks/torch_sqrt.h"
#include "agent/core/foreach_groups.h"
#include "common/log.h"
#include "common/optimizer_bytes.h"
#include "common/status.h"

namespace memplan::chunks {
namespace {

// Elements per CPU optimizer task: big enough to amortise scheduling, small enough that the
// pool balances a few large tensors across all threads.
constexpr int64_t kTaskElems = int64_t{1} << 18;
// One piece of CPU optimizer work on a contiguous element range of one parameter.
struct RangeWork {
  int64_t begin = 0;  // element offset into the chunk's arrays
  int64_t len = 0;
  bool accumulate = false;
  bool first = false;  // first micro-batch with a grad: copy instead of add
  bool update = false;
  bool restore = false;  // [Speculative clipped updates]: a redo, or the speculation dropped
  int64_t from = 0;  // the range's first element within its parameter (adamw8bit's block phase)
  int64_t step = 0;  // the parameter's update count after this update
  int param = 0;     // its index in the manager's parameter order ([Stochastic rounding] key)
  AdamWStepScalars scalars;  // adamw
};

// Where one piece of an update finds each array it touches (the piece's first element, and
// adamw8bit's first slot); null where the optimizer has no such array.
struct UpdateArrays {
  float* target32 = nullptr;    // the fp32 master, or the fp32 parameters without one
  uint16_t* param16 = nullptr;  // bf16 parameters (without a master: the target)
  char* exp_avg = nullptr;
  char* exp_avg_sq = nullptr;
  float* exp_avg_absmax = nullptr;
  float* exp_avg_sq_absmax = nullptr;
};

}  // namespace

void ChunkOptimizer::ScheduleChunkWork(int c, bool accumulate, bool update, float grad_scale,
                                       Copies copies) {
  const Chunk& layout = set_.chunk(c);
  ChunkState& chunk = chunks_[c];
  const ChunkManagerOptions& options = set_.options();
  std::vector<RangeWork> work;
  for (int i : layout.params) {
    const Param& p = set_.param(i);
    ParamState& s = params_[i];
    RangeWork base;
    base.param = i;
    if (accumulate) {
      base.accumulate = s.grad_this_micro && chunk.grad_accum.data() != nullptr;
      base.first = !s.grad_in_step;
      s.grad_in_step = s.grad_in_step || s.grad_this_micro;
      s.grad_this_micro = false;
    }
    // torch::optim::AdamW skips parameters without a grad: no decay, no step count.
    base.update = update && s.grad_in_step;
    // [Speculative clipped updates]: a redo keeps the speculative update's step count; a restore
    // without one takes it back.
    base.restore = copies == Copies::kRedoOrDrop && s.grad_in_step;
    if (base.update) {
      base.step = base.restore ? s.step : ++s.step;
      base.scalars = MakeAdamWStepScalars(options.adamw, base.step);
    } else if (base.restore) {
      --s.step;
    }
    if (!base.accumulate && !base.update && !base.restore) continue;
    const OwnedRange owned = set_.Owned(p, layout);  // the whole parameter unless sharded
    // adamw8bit: tasks end on the parameter's block boundaries (kTaskElems is a multiple of 256
    // and the pieces are cut at parameter offsets that are multiples of it).
    const int64_t phase = quantized() ? owned.from % kTaskElems : 0;
    for (int64_t off = 0; off < owned.len;) {
      RangeWork w = base;
      w.begin = owned.at + off;
      w.from = owned.from + off;
      w.len = std::min(kTaskElems - (off == 0 ? phase : 0), owned.len - off);
      work.push_back(w);
      off += w.len;
    }
  }
  if (update) chunk.update_started = true;
  if (copies == Copies::kSpeculate && update) chunk.speculative = true;
  if (work.empty()) return;
  // An all-gather may still read param_host (CPU: Gloo reads it in place).
  if (update && set_.sharded()) pager_.FinishGatherOf(c);

  const EventPtr copied = chunk.grads_copied;
  const EventPtr uploaded = pager_.uploaded(c);
  const OptimizerKind kind = optimizer();
  const bool narrow = set_.dtype() != torch::kFloat32;  // bf16 staging copy and upload copy
  const bool keeps_master = master();
  const int64_t torch_vector_elems = TorchBf16VectorElems();
  const int64_t slot = slot_elems();
  const AdamWOptions adamw = options.adamw;
  const SgdStepScalars sgd = MakeSgdStepScalars(adamw.lr, adamw.weight_decay);
  const bool stochastic = options.stochastic_rounding;
  const uint64_t seed = options.rounding_seed;
  char* stage = static_cast<char*>(chunk.grad_stage.data());
  void* grad = HostGrad(c);
  float* grad32 = static_cast<float*>(grad);
  uint16_t* accum16 = chunk.grad_accum.as<uint16_t>();
  // The arrays the update reads and writes, live.
  float* master32 = HostMaster(c);
  uint16_t* param16 = layout.param_host.as<uint16_t>();
  char* exp_avg = chunk.exp_avg.as<char>();
  char* exp_avg_sq = chunk.exp_avg_sq.as<char>();
  float* exp_avg_absmax = chunk.exp_avg_absmax.as<float>();
  float* exp_avg_sq_absmax = chunk.exp_avg_sq_absmax.as<float>();
  const int64_t moment_bytes = OptimizerMomentElemBytes(kind, set_.elem_size());
  // [Speculative clipped updates] A speculative update, and its redo with the coefficient, leave
  // the live arrays as they were and write the chunk's second copies of what the update writes
  // (the master where there is one, the parameters rounded from it being written in place; else
  // the parameters; the moments; adamw8bit's absmax slots) until Step() swaps the two
  // (CommitSpeculation()). Each piece goes through a per-thread tile: copied in, updated there,
  // written out with streaming stores, so the copies cost no more memory traffic than an update
  // in place.
  const bool into_copies = update && copies != Copies::kNone;
  const bool moments = has_moments(), absmax = quantized();
  // The target, the moments, the absmax slots: the order the task's callback reads the tiles in.
  std::vector<TileArray> tiled;
  if (into_copies) {
    tiled.push_back({reinterpret_cast<char*>(master32), chunk.copy_target.as<char>(),
                     keeps_master ? 4 : set_.elem_size(), false});
    if (moments) {
      tiled.push_back({exp_avg, chunk.copy_exp_avg.as<char>(), moment_bytes, false});
      tiled.push_back({exp_avg_sq, chunk.copy_exp_avg_sq.as<char>(), moment_bytes, false});
    }
    if (absmax) {
      tiled.push_back(
          {reinterpret_cast<char*>(exp_avg_absmax), chunk.copy_exp_avg_absmax.as<char>(), 4, true});
      tiled.push_back({reinterpret_cast<char*>(exp_avg_sq_absmax),
                       chunk.copy_exp_avg_sq_absmax.as<char>(), 4, true});
    }
  }
  std::atomic<bool>* failed = &worker_failed_;
  CpuPassCounters* passes = &cpu_passes_;
  TaskTracker* tracker = chunk.tasks.get();
  tracker->Add(static_cast<int>(work.size()));
  for (const RangeWork& w : work) {
    pool_.Schedule([=] {
      if (copied) copied->synchronize();
      auto since = [](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - t)
            .count();
      };
      if (w.accumulate) {
        const auto accumulate_start = std::chrono::steady_clock::now();
        const uint16_t* in16 = reinterpret_cast<const uint16_t*>(stage) + w.begin;
        if (kind == OptimizerKind::kAdamWBf16States ||
            (kind == OptimizerKind::kAdamW8bit && narrow)) {
          // bf16 sum rounded after every add, as torch accumulates a bf16 .grad.
          AccumulateGradBf16Rounded(w.first, w.len, in16, accum16 + w.begin);
        } else if (narrow) {
          AccumulateGradBf16(w.first, w.len, in16, grad32 + w.begin);
        } else {
          AccumulateGrad(w.first, w.len, reinterpret_cast<const float*>(stage) + w.begin,
                         grad32 + w.begin);
        }
        passes->accumulate_ns.fetch_add(since(accumulate_start), std::memory_order_relaxed);
        passes->accumulated.fetch_add(w.len, std::memory_order_relaxed);
      }
      // One piece of the range: the update, and the parameters rounded from the master. `a`:
      // where the piece's first element (and adamw8bit's first slot) is in each array.
      auto update_piece = [&](const RangeWork& r, const UpdateArrays& a) {
        switch (kind) {
          case OptimizerKind::kAdamW:
            AdamWUpdate(r.scalars, grad_scale, r.len, a.target32, grad32 + r.begin,
                        reinterpret_cast<float*>(a.exp_avg), reinterpret_cast<float*>(a.exp_avg_sq),
                        &TorchSqrt);
            break;
          case OptimizerKind::kSgd:
            SgdUpdate(sgd, grad_scale, r.len, a.target32, grad32 + r.begin);
            break;
          case OptimizerKind::kAdamW8bit: {
            // [8-bit optimizer state]: a block starting at shard element e has slot ceil(e / g);
            // the range's first block is the rest of the parameter block it starts in.
            QuantBlocks blocks;
            blocks.first_block_elems = kQuantBlockElems - r.from % kQuantBlockElems;
            blocks.first_slot_gap =
                (r.begin + blocks.first_block_elems + slot - 1) / slot - FirstSlot(r.begin, slot);
            blocks.slot_stride = kQuantBlockElems / slot;
            uint8_t* m = reinterpret_cast<uint8_t*>(a.exp_avg);
            uint8_t* v = reinterpret_cast<uint8_t*>(a.exp_avg_sq);
            if (narrow) {
              AdamW8bitUpdateBf16(r.scalars, grad_scale, r.len, blocks, a.param16,
                                  static_cast<const uint16_t*>(grad) + r.begin, m, v,
                                  a.exp_avg_absmax, a.exp_avg_sq_absmax, &TorchSqrt,
                                  MakeParamRounding(stochastic, seed, r.param, r.step, r.from));
            } else {
              AdamW8bitUpdate(r.scalars, grad_scale, r.len, blocks, a.target32, grad32 + r.begin, m,
                              v, a.exp_avg_absmax, a.exp_avg_sq_absmax, &TorchSqrt);
            }
            break;
          }
          case OptimizerKind::kAdamWBf16States:
            if (torch_vector_elems > 0) {
              // torch.optim.AdamW(fused=True) on bf16 parameters, as the persistent chunks run it,
              // bit for bit (AdamWBf16Update, cpu_adamw.h), without torch's dispatch and intra-op
              // threads inside each pool task: 1.5x the rate of at::_fused_adamw_ on 16 threads
              // (docs/benchmarks.md, "CPU optimizer passes").
              AdamWBf16Update(r.scalars, grad_scale, r.len, a.param16,
                              static_cast<const uint16_t*>(grad) + r.begin,
                              reinterpret_cast<uint16_t*>(a.exp_avg),
                              reinterpret_cast<uint16_t*>(a.exp_avg_sq), torch_vector_elems);
              break;
            }
            // torch's own fused kernel on host views of the range, where its CPU dispatch is one
            // AdamWBf16Update does not reproduce.
            try {
              auto view = [&r](void* first) {
                return torch::from_blob(first, {r.len},
                                        torch::TensorOptions().dtype(torch::kBFloat16));
              };
              torch::Tensor g = view(static_cast<uint16_t*>(grad) + r.begin);
              // clip_grad_norm_'s grad.mul_(coef): a bf16 product (coef is a bf16 value).
              if (grad_scale != 1.0f) g.mul_(static_cast<double>(grad_scale));
              at::_fused_adamw_({view(a.param16)}, {g}, {view(a.exp_avg)}, {view(a.exp_avg_sq)}, {},
                                {torch::full({}, static_cast<double>(r.step), torch::kFloat32)},
                                adamw.lr, adamw.beta1, adamw.beta2, adamw.weight_decay, adamw.eps,
                                /*amsgrad=*/false, /*maximize=*/false);
            } catch (const c10::Error& e) {
              MEMPLAN_LOG(kError, "CPU optimizer update failed")
                  .Field("error", std::string(e.what_without_backtrace()));
              failed->store(true);
            }
            break;
        }
        if (keeps_master) RoundToBf16(r.len, a.target32, param16 + r.begin);
      };
      // The live arrays at range r.
      auto live = [&](const RangeWork& r) {
        UpdateArrays a;
        a.target32 = master32 + r.begin;
        a.param16 = param16 + r.begin;
        if (moments) {
          a.exp_avg = exp_avg + r.begin * moment_bytes;
          a.exp_avg_sq = exp_avg_sq + r.begin * moment_bytes;
        }
        if (absmax) {
          a.exp_avg_absmax = exp_avg_absmax + FirstSlot(r.begin, slot);
          a.exp_avg_sq_absmax = exp_avg_sq_absmax + FirstSlot(r.begin, slot);
        }
        return a;
      };
      if (!w.update && !w.restore) {
        tracker->Done();
        return;
      }
      if (uploaded) uploaded->synchronize();  // param_host may still be the upload source
      const auto update_start = std::chrono::steady_clock::now();
      if (w.restore && !w.update) {
        // [Speculative clipped updates] The speculative values are dropped: the live arrays
        // were never written, except the parameters rounded from a master.
        if (keeps_master) RoundToBf16(w.len, master32 + w.begin, param16 + w.begin);
        tracker->Done();
        return;
      }
      if (!tiled.empty()) {
        UpdateIntoCopies(
            w.begin, w.len, tiled, slot, [&](int64_t begin, int64_t len, char* const* tile) {
              RangeWork piece = w;
              piece.begin = begin;
              piece.from = w.from + (begin - w.begin);
              piece.len = len;
              UpdateArrays a = live(piece);  // the parameters of a master are written in place
              int k = 0;
              if (keeps_master) {
                a.target32 = reinterpret_cast<float*>(tile[k++]);
              } else {
                a.target32 = reinterpret_cast<float*>(tile[k]);
                a.param16 = reinterpret_cast<uint16_t*>(tile[k++]);
              }
              if (moments) {
                a.exp_avg = tile[k++];
                a.exp_avg_sq = tile[k++];
              }
              if (absmax) {
                a.exp_avg_absmax = reinterpret_cast<float*>(tile[k++]);
                a.exp_avg_sq_absmax = reinterpret_cast<float*>(tile[k++]);
              }
              update_piece(piece, a);
            });
      } else {
        update_piece(w, live(w));
      }
      passes->update_ns.fetch_add(since(update_start), std::memory_order_relaxed);
      passes->updated.fetch_add(w.len, std::memory_order_relaxed);
      tracker->Done();
    }, /*order=*/c,  // [Deferred CPU updates]: the next forward needs chunk c after c - 1
       /*urgent=*/!update);  // [Urgent accumulations] (README): the next hook may wait for it
  }
}

absl::StatusOr<double> ChunkOptimizer::ShardedSquaredNorm() {
  // Chunks whose squares were summed on the device at their reduce-scatter add those; the others
  // (several micro-batches summed on the host) are read from host memory.
  double local = 0;
  std::vector<torch::Tensor> on_device;
  for (int c = 0; c < set_.num_chunks(); ++c) {
    const Chunk& layout = set_.chunk(c);
    if ((!layout.persistent || layout.state_sharded) && chunks_[c].shard_squares.defined()) {
      on_device.push_back(chunks_[c].shard_squares.reshape({1}));
    }
  }
  for (int i = 0; i < set_.num_params(); ++i) {
    const Param& p = set_.param(i);
    const Chunk& layout = set_.chunk(p.chunk);
    if (layout.persistent || !params_[i].grad_in_step || chunks_[p.chunk].shard_squares.defined()) {
      continue;
    }
    const OwnedRange r = set_.Owned(p, layout);
    if (r.len == 0) continue;
    local += ChunkSet::HostFlat(HostGrad(p.chunk), r.at, r.len, host_grad_dtype())
                 .to(torch::kFloat64)
                 .pow(2)
                 .sum()
                 .item<double>();
  }
  Communicator& comm = collectives_.comm();
  torch::Tensor total = torch::full(
      {1}, local, torch::TensorOptions().dtype(torch::kFloat64).device(comm.device()));
  if (!on_device.empty()) total.add_(torch::cat(on_device).sum().to(comm.device()));
  RETURN_IF_ERROR(collectives_.NoteCollective(comm.AllReduceSum(total)->Wait()));
  double squares = total.cpu().item<double>();
  // Persistent grads are replicated (all-reduced already): every rank adds the same, once.
  std::vector<torch::Tensor> persistent;
  for (int i = 0; i < set_.num_params(); ++i) {
    const Param& p = set_.param(i);
    const Chunk& layout = set_.chunk(p.chunk);
    if (layout.persistent && !layout.state_sharded && p.tensor.grad().defined()) {
      persistent.push_back(p.tensor.grad().to(torch::kFloat64).pow(2).sum());
    }
  }
  if (!persistent.empty()) squares += torch::stack(persistent).sum().item<double>();
  return squares;
}

void ChunkOptimizer::CopyMastersToParams(const std::vector<int>& updated) {
  // [Whole-chunk master copy] A chunk whose every parameter was updated takes its whole fp32
  // master in one copy (alignment gaps included: the master was made from the same span, so they
  // round back to what they were); otherwise one copy per updated parameter. Either way each
  // parameter becomes its master rounded to the model dtype.
  for (size_t k = 0; k < updated.size();) {
    const int c = set_.param(updated[k]).chunk;
    size_t end = k;
    while (end < updated.size() && set_.param(updated[end]).chunk == c) ++end;
    Chunk& layout = set_.chunk(c);
    const torch::Tensor& flat = chunks_[c].device_master;
    if (!layout.state_sharded && flat.defined() && flat.numel() == layout.span_elems &&
        end - k == layout.params.size()) {
      layout.device.narrow(0, layout.shard_begin, layout.span_elems).copy_(flat);
    } else {
      for (size_t j = k; j < end; ++j) {
        set_.param(updated[j]).tensor.detach().copy_(params_[updated[j]].master);
      }
    }
    k = end;
  }
}

absl::Status ChunkOptimizer::UpdateShardedPersistent(const torch::Tensor& clip_coef,
                                                     float grad_scale) {
  // [Sharded persistent state] The same arithmetic as the replicated persistent chunks' update
  // (clip the model-dtype grad, widen it for a master, AdamW / SGD per parameter), on the owned
  // ranges of this rank's shard; then the shard goes back into the flat parameters and is
  // all-gathered. Two gathers in flight at most: each holds a copy of its shard.
  struct Gather {
    std::unique_ptr<PendingCollective> work;
    torch::Tensor src;
  };
  std::deque<Gather> gathers;
  absl::Status status;
  auto finish_oldest = [&] {
    const absl::Status s = collectives_.NoteCollective(gathers.front().work->Wait());
    if (status.ok()) status = s;
    gathers.pop_front();
  };
  const int64_t slice_elems = StepGradCopyElems(std::numeric_limits<int64_t>::max(),
                                                set_.options().chunk_bytes, set_.elem_size());
  for (int c = 0; c < set_.n_persist() && status.ok(); ++c) {
    Chunk& layout = set_.chunk(c);
    ChunkState& chunk = chunks_[c];
    if (!layout.state_sharded || !chunk.grad_shard.defined()) continue;
    {
      PersistentUpdate update(*this, clip_coef, grad_scale, slice_elems);
      std::vector<int> held;  // the parameters with a grad of which this rank stores a part
      std::vector<torch::Tensor> grads;
      for (int i : layout.params) {
        ParamState& s = params_[i];
        if (!s.grad_in_step) continue;
        ++s.step;  // on every rank, whether or not it stores part of p
        const OwnedRange r = set_.Owned(set_.param(i), layout);
        if (r.len == 0) continue;
        held.push_back(i);
        grads.push_back(chunk.grad_shard.narrow(0, r.at, r.len));
      }
      update.ClipGrads(grads);
      for (size_t k = 0; k < held.size(); ++k) {
        ParamState& s = params_[held[k]];
        const OwnedRange r = set_.Owned(set_.param(held[k]), layout);
        // [Sharded persistent parameters]: the shard is all the rank holds.
        const torch::Tensor target =
            master()                ? s.master
            : layout.params_sharded ? layout.param_shard.narrow(0, r.at, r.len)
                                    : layout.device.narrow(0, layout.shard_begin + r.at, r.len);
        update.Add(s, target, grads[k], s.exp_avg, s.exp_avg_sq);
      }
      update.Flush();
    }
    if (layout.params_sharded) {
      if (master()) layout.param_shard.copy_(chunk.device_master);
      continue;  // gathered when a group next uses it
    }
    torch::Tensor shard = layout.device.narrow(0, layout.shard_begin, layout.shard_elems);
    if (master()) shard.copy_(chunk.device_master);
    if (gathers.size() >= 2) finish_oldest();
    Gather gather;
    gather.src = shard.clone();
    gather.work = collectives_.comm().AllGather(layout.device, gather.src);
    gathers.push_back(std::move(gather));
  }
  while (!gathers.empty()) finish_oldest();
  return status;
}

void ChunkOptimizer::ScheduleStepUpdates(float grad_scale, const torch::Tensor& clip_coef) {
  // Offloaded chunks not updated during backward: on the CPU pool, in chunk order, and those of
  // [Device updates of offloaded chunks] queued on the device beside them.
  std::vector<int> on_device;
  for (int c = set_.n_persist(); c < set_.num_chunks(); ++c) {
    if (chunks_[c].update_started) continue;
    if (chunks_[c].device_update) {
      on_device.push_back(c);
    } else {
      ScheduleChunkWork(c, /*accumulate=*/false, /*update=*/true, grad_scale);
    }
  }
  if (!on_device.empty()) StartDeviceUpdates(on_device, grad_scale, clip_coef);
}

absl::Status ChunkOptimizer::Step(double max_grad_norm) {
  grad_copies_.clear();  // backward is over: nothing more to bound
  const ChunkManagerOptions& options = set_.options();
  if (options.frozen) return absl::OkStatus();
  if (options.profile_only) {
    return absl::FailedPreconditionError(
        "Step(): this chunk manager was created with profile_only (no optimizer state)");
  }
  torch::NoGradGuard no_grad;
  // [Deferred CPU updates] One rule for both ways an offloaded update starts: those that started
  // in backward (nothing clipped) keep running past Step() as the ones queued below do, and the
  // next forward meets each chunk's own update. Everything else in flight finishes here.
  const bool defer = options.defer_step_updates && StepUpdatesDeferred(set_.world());
  WaitInFlight(/*started_updates=*/!defer);
  // Those that started in backward were queued last block first; the next forward meets them
  // first block first, so what is not running yet runs in chunk order, as the clipped step's.
  if (defer) pool_.QueueInOrder();
  pager_.ReleaseAllPersistent();  // stale once updated; the next forward gathers the new shards
  const bool started = AnyUpdateStarted();
  last_step_skipped_ = false;
  // Every failure drops the step: buffers are stale, the gradients gone, no update left running.
  auto fail = [this](absl::Status status) {
    RedoOrDropSpeculation(/*redo=*/false, 1.0f);  // waits for every task first
    pager_.InvalidateBuffers();
    ResetStep();
    return status;
  };
  if (worker_failed_.exchange(false)) {  // [Deferred CPU updates] of the previous step
    return fail(absl::InternalError(
        "optimizer step: a CPU update left running by the previous step (or started in this "
        "step's backward) failed (see the log); this step's gradients were dropped"));
  }
  if (overrun_) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "gradients arrived for a chunk after its update started: more micro-batches than "
        "grad_accum (",
        options.grad_accum, ") before Step(); the step's gradients were dropped")));
  }
  if (max_grad_norm > 0 && started && !speculating_) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "Step(max_grad_norm=", max_grad_norm,
        ") cannot clip: options.max_grad_norm=0 let CPU updates start during backward")));
  }
  if (!collectives_.status().ok()) {  // a collective failed during forward/backward
    return fail(collectives_.status());
  }
  // clip_grad_norm_: per-parameter norms in ParamOrder(), stacked, normed again. With several
  // micro-batches the offloaded grads' norms need a pass over host memory; skip it when nothing
  // is clipped and no check asks for it (LastGradNorm() is then NaN).
  const bool want_norm = max_grad_norm > 0 || options.grad_accum == 1 || options.skip_nonfinite;
  try {
    double sharded_norm = -1;  // [Sharded chunks]: the global norm over every rank's shards
    if (set_.sharded()) {
      absl::Status reduced = AllReducePersistentGrads();
      absl::StatusOr<double> squares = 0.0;
      if (reduced.ok() && want_norm) {
        squares = ShardedSquaredNorm();
      }
      if (!reduced.ok() || !squares.ok()) return fail(reduced.ok() ? squares.status() : reduced);
      sharded_norm = std::sqrt(*squares);
    }
    // The replicated persistent parameters with a grad (device-resident, all-reduced by now):
    // their norms and the update below.
    std::vector<int> resident;
    std::vector<torch::Tensor> resident_grads;
    for (int i = 0; i < set_.num_params(); ++i) {
      const Param& p = set_.param(i);
      const Chunk& owner = set_.chunk(p.chunk);
      if (owner.persistent && !owner.state_sharded && p.tensor.grad().defined()) {
        resident.push_back(i);
        resident_grads.push_back(p.tensor.grad());
      }
    }
    std::vector<torch::Tensor> norms;
    if (want_norm && !set_.sharded()) {
      // The persistent grads' norms as clip_grad_norm_'s foreach path takes them: one
      // _foreach_norm per device and dtype, not a kernel per parameter; then every norm in
      // ParamOrder() (a manager that trains holds one dtype, so that is clip_grad_norm_'s order:
      // one group in parameter order).
      const std::vector<torch::Tensor> resident_norms = ForeachNorms(resident_grads);
      size_t next_resident = 0;
      for (int i = 0; i < set_.num_params(); ++i) {
        const Param& p = set_.param(i);
        ParamState& s = params_[i];
        // Norms stay on the compute device: one synchronisation for the whole step (reading
        // each one back cost a device round trip per parameter).
        if (set_.chunk(p.chunk).persistent) {
          if (p.tensor.grad().defined()) norms.push_back(resident_norms[next_resident++]);
          continue;
        }
        if (!s.grad_in_step) continue;
        if (!s.grad_norm.defined()) {
          WaitTasks(p.chunk);  // a deferred chunk's accumulation may still be writing it
          s.grad_norm = ChunkSet::HostView(HostGrad(p.chunk), p.offset_elems, p.shape, p.numel,
                                           host_grad_dtype())
                            .norm(2.0);
        }
        norms.push_back(s.grad_norm.to(options.device));
      }
    }
    float grad_scale = 1.0f;
    torch::Tensor clip_coef;
    last_grad_norm_ = want_norm ? 0 : std::numeric_limits<double>::quiet_NaN();
    if (want_norm && set_.sharded()) {
      last_grad_norm_ = sharded_norm;
      if (max_grad_norm > 0) {
        // clip_grad_norm_'s coefficient, in fp32 as its tensors compute it.
        grad_scale = std::min(
            1.0f, static_cast<float>(max_grad_norm) / (static_cast<float>(sharded_norm) + 1e-6f));
        clip_coef =
            torch::full({}, static_cast<double>(grad_scale),
                        torch::TensorOptions().dtype(torch::kFloat32).device(options.device));
      }
    } else if (!norms.empty()) {
      torch::Tensor total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2.0);
      if (max_grad_norm > 0) {
        clip_coef = torch::clamp(max_grad_norm / (total + 1e-6), std::nullopt, 1.0);
        const torch::Tensor host = torch::stack({total, clip_coef}).to(torch::kCPU);
        last_grad_norm_ = host[0].item<double>();
        grad_scale = host[1].item<float>();
      } else {
        last_grad_norm_ = total.item<double>();
      }
    }
    // [Non-finite steps] Nothing has been updated yet: drop the step, as a failure would, but
    // report success. Every rank holds the same global norm, so every rank skips.
    if (options.skip_nonfinite && !std::isfinite(last_grad_norm_)) {
      pager_.InvalidateBuffers();
      ResetStep();
      last_step_skipped_ = true;
      return absl::OkStatus();
    }

    // [Speculative clipped updates] Updates that started in backward as if nothing were clipped
    // stand when nothing is (grad_scale exactly 1, the identity clip_grad_norm_ then applies);
    // otherwise they are redone from the live arrays with the coefficient, queued first as below.
    last_step_clipped_ = max_grad_norm > 0 && grad_scale != 1.0f;
    if (speculating_ && started) {
      ++speculation_.speculated;
      if (grad_scale != 1.0f) RedoOrDropSpeculation(/*redo=*/true, grad_scale);
    }
    // [Deferred CPU updates] Queued first, in chunk order, so the pool works beside the
    // persistent chunks' device update below and then beside the next forward.
    if (defer) ScheduleStepUpdates(grad_scale, clip_coef);

    // Persistent chunks: on the device, one fused call per chunk, so that the fp32 copies of a
    // mixed-precision model's grads exist for one chunk at a time (not for the whole model); a
    // parameter larger than a regular chunk is updated in slices of a chunk's elements
    // ([Sliced grad copy], common/optimizer_bytes.h), so the fp32 transient never exceeds one
    // regular chunk's and the caching allocator reuses the same block for every slice.
    const int64_t slice_elems = StepGradCopyElems(std::numeric_limits<int64_t>::max(),
                                                  options.chunk_bytes, set_.elem_size());
    std::vector<int> updated;
    {
      PersistentUpdate update(*this, clip_coef, grad_scale, slice_elems);
      update.ClipGrads(resident_grads);  // not adamw8bit's: it clips inside its update
      int batch_chunk = -1;
      for (int i : resident) {
        const Param& p = set_.param(i);
        ParamState& s = params_[i];
        if (p.chunk != batch_chunk) {
          update.Flush();  // one fused call per chunk at most
          batch_chunk = p.chunk;
        }
        ++s.step;
        if (quantized()) {
          AdamW8bitTorchUpdate(options.adamw, s.step, clip_coef, quant_maps_, p.tensor.detach(),
                               p.tensor.grad(), s.exp_avg, s.exp_avg_sq, s.exp_avg_absmax,
                               s.exp_avg_sq_absmax,
                               MakeParamRounding(options.stochastic_rounding,
                                                 options.rounding_seed, static_cast<int64_t>(i),
                                                 s.step, 0));
          continue;
        }
        updated.push_back(i);
        update.Add(s, master() ? s.master : p.tensor.detach(), p.tensor.grad(), s.exp_avg,
                   s.exp_avg_sq);
      }
      update.Flush();
    }
    if (master()) CopyMastersToParams(updated);
    if (set_.sharded() && options.shard_persistent_state) {
      if (const absl::Status s = UpdateShardedPersistent(clip_coef, grad_scale); !s.ok()) {
        return fail(s);
      }
    }

    if (!defer) {
      ScheduleStepUpdates(grad_scale, clip_coef);
      WaitAll();
    }
  } catch (const c10::Error& e) {
    return fail(TorchError(e, "optimizer step"));
  }
  if (worker_failed_.exchange(false)) {
    return fail(absl::InternalError("optimizer step: a CPU update failed (see the log)"));
  }
  // [Speculative clipped updates] The step stands: the updated copies become the live arrays.
  CommitSpeculation();
  // Device copies of offloaded chunks are stale now; the next forward uploads fresh values.
  pager_.InvalidateBuffers();
  ResetStep();
  return absl::OkStatus();
}

}  // namespace memplan::chunks
