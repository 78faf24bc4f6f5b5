#include "agent/chunks/chunk_collectives.h"

#include <string>
#include <utility>
#include <vector>

#include "agent/core/foreach_groups.h"
#include "common/status.h"

namespace memplan::chunks {

void ChunkCollectives::FailCollective(const absl::Status& status) {
  (void)NoteCollective(status);
  TORCH_CHECK(false, std::string(status.message()));
}

std::shared_ptr<GatherBatch> ChunkCollectives::JoinGatherBatch(int64_t bytes) {
  ++stats_.uploads;
  stats_.bytes += bytes;
  ++stats_.gathers;
  if (!open_gathers_) open_gathers_ = std::make_shared<GatherBatch>();
  open_gathers_->bytes += bytes;
  return open_gathers_;
}

void ChunkCollectives::FlushGathers() {
  if (!open_gathers_) return;
  std::shared_ptr<GatherBatch> batch = std::move(open_gathers_);  // a new batch opens next time
#ifdef MEMPLAN_CHUNKS_CUDA
  // The collective is ordered after the upload stream: after every shard's copy queued before.
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (streams_.cuda()) guard.emplace(streams_.upload());
#endif
  batch->work = batch->outputs.size() == 1
                    ? comm_->AllGather(batch->outputs[0], batch->inputs[0])
                    : comm_->AllGatherCoalesced(batch->outputs, batch->inputs);
}

absl::Status ChunkCollectives::FinishBatch(std::shared_ptr<GatherBatch>& gather) {
  if (!gather) return absl::OkStatus();
  std::shared_ptr<GatherBatch> batch = std::move(gather);  // leaves `gather` null
  if (!batch->work) FlushGathers();  // still queued: a buffer reused within one batch
  if (!batch->waited) {
    batch->waited = true;
    batch->status = batch->work->Wait();
    if (batch->status.ok()) {
      batch->outputs.clear();
      batch->inputs.clear();
      timed_gathers_.push_back(batch);
      FoldTimedGathers(/*wait=*/false);
    }
  }
  return NoteCollective(batch->status);
}

void ChunkCollectives::FoldTimedGathers(bool wait) {
  while (!timed_gathers_.empty()) {
    GatherBatch& batch = *timed_gathers_.front();
    // Beyond the bound the oldest is waited for (its collective is long done in practice).
    const bool must = wait || timed_gathers_.size() > kMaxTimedGathers;
    const absl::StatusOr<double> seconds = batch.work->DeviceSeconds(must);
    if (!seconds.ok() && absl::IsUnavailable(seconds.status())) return;  // still running
    const int64_t bytes = batch.bytes;
    if (seconds.ok()) {
      ++stats_.gathers_timed;
      stats_.gather_output_bytes += bytes;
      stats_.gather_seconds += *seconds;
      if (stats_.gather_seconds_each.size() < ChunkUploadStats::kMaxGatherSamples) {
        stats_.gather_seconds_each.push_back(static_cast<float>(*seconds));
        stats_.gather_sampled_bytes += bytes;
      }
    }
    timed_gathers_.pop_front();
  }
}

void ChunkCollectives::StartShardReduce(int c, torch::Tensor grad_flat,
                                        const torch::Tensor& stage, bool whole_step,
                                        bool update_now) {
  // Two in flight at most (the planner's two fp32 padded chunks of grads): the oldest finishes.
  if (pending_shard_reduces_.size() >= 2) {
    const absl::Status s = FinishShardReduce(pending_shard_reduces_.front());
    pending_shard_reduces_.erase(pending_shard_reduces_.begin());
    if (!s.ok()) FailCollective(s);
  }
  PendingShardReduce r;
  r.chunk = c;
  r.whole_step = whole_step;
  r.update_now = update_now;
  r.grad_flat = std::move(grad_flat);
  r.stage = stage;
  // grad_flat is fp32: the sum over the ranks runs in fp32 and the mean is rounded once into the
  // staging area's model dtype (an fp32 model on the CPU reduces straight into it).
  r.in_place = !set_.cuda() && set_.dtype() == torch::kFloat32;
  r.shard = r.in_place ? stage : torch::empty({set_.chunk(c).shard_elems}, r.grad_flat.options());
  r.work = comm_->ReduceScatterSum(r.shard, r.grad_flat);
  pending_shard_reduces_.push_back(std::move(r));
}

absl::Status ChunkCollectives::FinishShardReduce(PendingShardReduce& r) {
  // CUDA: the current (compute) stream waits for it.
  RETURN_IF_ERROR(NoteCollective(r.work->Wait()));
  const torch::ScalarType dtype = set_.dtype();
  torch::Tensor& shard = r.shard;
  shard.div_(set_.world());
  ShardStaged staged;
  staged.chunk = r.chunk;
  staged.update_now = r.update_now;
  if (r.whole_step) {
    // The host grad will hold the shard rounded to the model dtype (padding and parameters
    // without a grad are zeros): its squares, summed where the shard already is.
    torch::Tensor rounded = dtype == torch::kFloat32 ? shard : shard.to(dtype);
    staged.squares = rounded.to(torch::kFloat64).pow(2).sum();
  }
  if (set_.cuda()) {
#ifdef MEMPLAN_CHUNKS_CUDA
    torch::Tensor narrow = shard.to(dtype);
    streams_.RecordOnCompute()->block(streams_.offload());
    {
      c10::cuda::CUDAStreamGuard guard(streams_.offload());
      r.stage.copy_(narrow, /*non_blocking=*/true);
    }
    c10::cuda::CUDACachingAllocator::recordStream(narrow.storage().data_ptr(), streams_.offload());
    staged.copied = std::make_shared<Event>();
    staged.copied->record(streams_.offload());
#endif
  } else if (!r.in_place) {
    r.stage.copy_(shard);
  }
  shard_staged_(staged);
  return absl::OkStatus();
}

absl::Status ChunkCollectives::FinishShardReduces() {
  absl::Status first;
  for (PendingShardReduce& r : pending_shard_reduces_) {
    const absl::Status s = FinishShardReduce(r);
    if (first.ok()) first = s;
  }
  pending_shard_reduces_.clear();
  return first;
}

void ChunkCollectives::StartAllReduce(torch::Tensor flat, std::vector<torch::Tensor> grads) {
  PendingReduce pending;
  pending.flat = std::move(flat);
  pending.grads = std::move(grads);
  pending.work = comm_->AllReduceSum(pending.flat);
  pending_reduce_ = std::move(pending);
}

void ChunkCollectives::StartStateReduceScatter(int c, torch::Tensor flat) {
  PendingReduce pending;
  pending.chunk = c;
  pending.flat = std::move(flat);
  pending.shard = torch::empty({set_.chunk(c).shard_elems},
                               pending.flat.options().dtype(torch::kFloat32));
  // [Narrow reduce-scatter] A 16-bit model's grads go on the link in their own dtype and are
  // summed in fp32 on arrival: an fp32 reduce-scatter's values for half its bytes. The exchange's
  // receive buffer is as large as the flat, so flat, receive buffer and fp32 shard take the bytes
  // an fp32 flat and shard took (StateReduceScatterBytes).
  const bool narrow = pending.flat.scalar_type() != torch::kFloat32;
  pending.work = narrow ? comm_->ReduceScatterSumWidened(pending.shard, pending.flat)
                        : comm_->ReduceScatterSum(pending.shard, pending.flat);
  state_reduce_bytes_ += static_cast<int64_t>((narrow ? 2 : 1) * pending.flat.nbytes() +
                                              pending.shard.nbytes());
  pending_state_reduces_.push_back(std::move(pending));
}

absl::Status ChunkCollectives::FinishStateReduces() {
  absl::Status first;
  for (PendingReduce& pending : pending_state_reduces_) {
    // CUDA: the compute stream waits for it.
    const absl::Status s = NoteCollective(pending.work->Wait());
    if (!s.ok()) {
      if (first.ok()) first = s;
      continue;
    }
    state_shard_(pending.chunk, pending.shard);
  }
  pending_state_reduces_.clear();
  state_reduce_bytes_ = 0;
  return first;
}

absl::Status ChunkCollectives::FinishPersistentReduce() {
  RETURN_IF_ERROR(FinishStateReduces());
  if (!pending_reduce_.has_value()) return absl::OkStatus();
  PendingReduce pending = std::move(*pending_reduce_);
  pending_reduce_.reset();
  // CUDA: the compute stream waits for it.
  RETURN_IF_ERROR(NoteCollective(pending.work->Wait()));
  pending.flat.div_(set_.world());
  std::vector<torch::Tensor> slices;
  int64_t at = 0;
  for (torch::Tensor& g : pending.grads) {
    slices.push_back(pending.flat.narrow(0, at, g.numel()).view(g.sizes()));
    at += g.numel();
  }
  ForeachCopy(pending.grads, slices);  // one kernel, not a copy per grad
  return absl::OkStatus();
}

torch::Tensor ChunkCollectives::GatherDevice(const torch::Tensor& shard) {
  // Read only: a host array on a CPU communicator is gathered in place, without a copy.
  torch::Tensor src = shard.contiguous().to(comm_->device());
  torch::Tensor full = torch::empty({src.numel() * set_.world()}, src.options());
  const absl::Status s = comm_->AllGather(full, src)->Wait();
  if (!s.ok()) FailCollective(s);
  return full.to(torch::kCPU);
}

torch::Tensor ChunkCollectives::GatherHost(const void* data, torch::ScalarType dtype,
                                           const Chunk& chunk, int64_t elems) {
  if (elems < 0) elems = chunk.shard_elems;
  return GatherDevice(
      torch::from_blob(const_cast<void*>(data), {elems}, torch::TensorOptions().dtype(dtype)));
}

void ChunkCollectives::ResetStep() {
  if (pending_reduce_.has_value()) {
    (void)pending_reduce_->work->Wait();  // the collective must not outlive its tensors
    pending_reduce_.reset();
  }
  for (PendingReduce& pending : pending_state_reduces_) (void)pending.work->Wait();
  pending_state_reduces_.clear();
  state_reduce_bytes_ = 0;
  for (PendingShardReduce& r : pending_shard_reduces_) {
    if (r.work) (void)r.work->Wait();
  }
  pending_shard_reduces_.clear();
}

}  // namespace memplan::chunks
