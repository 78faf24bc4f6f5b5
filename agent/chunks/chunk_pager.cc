#include "agent/chunks/chunk_pager.h"

#include <algorithm>
#include <set>
#include <vector>

#include "common/log.h"
#include "common/optimizer_bytes.h"

namespace memplan::chunks {

absl::Status ChunkPager::AssignHomes() {
  const int n_chunks = set_.num_chunks();
  const int n_persist = set_.n_persist();
  home_.assign(n_chunks, -1);
  materialized_.assign(n_chunks, false);
  uploaded_.assign(n_chunks, nullptr);
  gathered_.assign(n_chunks, false);
  gather_.assign(n_chunks, nullptr);
  min_buffers_ = set_.min_buffers();
  const ChunkManagerOptions& options = set_.options();
  const int non_persistent = n_chunks - n_persist;
  if (non_persistent == 0) return absl::OkStatus();
  int n_buffer = std::max(options.n_buffer, min_buffers_);
  // Chunks that must be resident together may not share a home.
  std::vector<std::set<int>> conflicts(n_chunks);
  for (int g = 0; g < set_.num_groups(); ++g) {
    const std::vector<int>& needed = set_.group_chunks(g);
    for (int a : needed) {
      for (int b : needed) {
        if (a != b) conflicts[a].insert(b);
      }
    }
  }
  // Round-robin with skips; a greedy colouring can need more slots than the largest group, so
  // grow until it succeeds (bounded by the chunk count).
  auto oversized = [&](int c) { return set_.layout().chunks()[c].oversized; };
  while (true) {
    bool ok = true;
    int next = 0;
    for (int c = n_persist; c < n_chunks && ok; ++c) {
      if (oversized(c)) continue;
      int home = -1;
      for (int k = 0; k < n_buffer; ++k) {
        const int candidate = (next + k) % n_buffer;
        bool clash = false;
        for (int other : conflicts[c]) {
          if (other < c && home_[other] == candidate) clash = true;
        }
        if (!clash) {
          home = candidate;
          break;
        }
      }
      if (home < 0) ok = false;
      home_[c] = home;
      next = (home + 1) % n_buffer;
    }
    if (ok) break;
    ++n_buffer;
  }
  if (n_buffer > options.n_buffer) {
    MEMPLAN_LOG(kWarning, "n_buffer raised: some group needs more chunks resident at once")
        .Field("requested", options.n_buffer)
        .Field("allocated", n_buffer)
        .Field("min_buffers", min_buffers_);
  }
  if (n_buffer > options.n_buffer) min_buffers_ = std::max(min_buffers_, n_buffer);
  // Oversized chunks get buffers of their own after the shared ones, so one large parameter
  // (an LM head, a wide MLP matrix) does not make every shared buffer that large.
  shared_buffers_ = n_buffer;
  int home = n_buffer;
  for (int c = n_persist; c < n_chunks; ++c) {
    if (oversized(c)) home_[c] = home++;
  }
  buffers_.resize(home);
  return absl::OkStatus();
}

absl::Status ChunkPager::AllocateBuffers() {
  const int64_t elem_bytes = set_.elem_size();
  // Shared buffers fit the largest regular chunk of the layout; an oversized chunk's own buffer
  // fits it exactly. See [Fixed buffer slots].
  // Sharded: padded to a multiple of the world size ([Sharded chunks]).
  const int64_t shared_elems =
      PaddedElems(set_.layout().MaxRegularChunkBytes() / elem_bytes, set_.world());
  try {
    for (size_t b = 0; b < buffers_.size(); ++b) {
      int64_t elems = shared_elems;
      if (static_cast<int>(b) >= shared_buffers_) {
        for (int c = set_.n_persist(); c < set_.num_chunks(); ++c) {
          if (home_[c] == static_cast<int>(b)) elems = set_.chunk(c).padded_elems;
        }
      }
      buffers_[b].storage = torch::zeros({elems}, set_.DeviceOptions());
      buffer_device_bytes_ += elems * elem_bytes;
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "allocating device chunk buffers");
  }
  return absl::OkStatus();
}

void ChunkPager::AddStats(ChunkMemoryStats& stats) const {
  stats.n_buffer = shared_buffers_;
  stats.n_oversized_buffers = static_cast<int>(buffers_.size()) - shared_buffers_;
  stats.buffer_device_bytes = buffer_device_bytes_;
  stats.persistent_gathers = persistent_gathers_;
}

void ChunkPager::Upload(int c) {
  const Chunk& chunk = set_.chunk(c);
  DeviceBuffer& buffer = buffers_[home_[c]];
  if (buffer.chunk == c) return;
  if (buffer.chunk >= 0) Dematerialize(buffer.chunk);
  buffer.chunk = c;
  wait_host_writes_(c);  // a CPU update still writing param_host would be uploaded half-done
  if (set_.sharded()) {
    StartGather(c, buffer);
    return;
  }
  const torch::ScalarType dtype = set_.dtype();
  torch::Tensor src = torch::from_blob(chunk.param_host.data(), {chunk.span_elems},
                                       torch::TensorOptions().dtype(dtype));
  torch::Tensor dst = buffer.storage.narrow(0, 0, chunk.span_elems);
#ifdef MEMPLAN_CHUNKS_CUDA
  if (set_.cuda()) {
    // The buffer's previous chunk may still be read by kernels queued on the compute stream.
    streams_.RecordOnCompute()->block(streams_.upload());
    c10::cuda::CUDAStreamGuard guard(streams_.upload());
    // Timing events (the default CUDAEvent disables timing): the start is recorded after the wait
    // above, so the measured span is the copy itself.
    auto start = std::make_shared<Event>(cudaEventDefault);
    start->record(streams_.upload());
    dst.copy_(src, /*non_blocking=*/true);
    auto ready = std::make_shared<Event>(cudaEventDefault);
    ready->record(streams_.upload());
    buffer.ready = ready;
    uploaded_[c] = ready;
    ++uploads_;
    upload_bytes_ += chunk.span_elems * static_cast<int64_t>(torch::elementSize(dtype));
    timed_uploads_.emplace_back(std::move(start), std::move(ready));
    if (timed_uploads_.size() >= 64) FoldTimedUploads(/*wait=*/false);
    return;
  }
#endif
  dst.copy_(src);
  buffer.ready = nullptr;
  ++uploads_;
  upload_bytes_ += chunk.span_elems * static_cast<int64_t>(torch::elementSize(dtype));
}

void ChunkPager::FoldTimedUploads(bool wait) {
#ifdef MEMPLAN_CHUNKS_CUDA
  // Uploads finish in stream order, so the finished ones form a prefix.
  size_t done = 0;
  for (; done < timed_uploads_.size(); ++done) {
    auto& [start, end] = timed_uploads_[done];
    if (wait) {
      end->synchronize();
    } else if (!end->query()) {
      break;
    }
    upload_seconds_ += static_cast<double>(start->elapsed_time(*end)) / 1000.0;
  }
  timed_uploads_.erase(timed_uploads_.begin(), timed_uploads_.begin() + done);
#else
  (void)wait;
#endif
}

ChunkUploadStats ChunkPager::UploadStats() {
  FoldTimedUploads(/*wait=*/true);
  collectives_.FoldTimedGathers(/*wait=*/true);
  ChunkUploadStats u = collectives_.gather_stats();
  u.uploads += uploads_;
  u.bytes += upload_bytes_;
  u.seconds += upload_seconds_;
  return u;
}

void ChunkPager::ResetUploadStats() {
  FoldTimedUploads(/*wait=*/true);
  collectives_.FoldTimedGathers(/*wait=*/true);
  uploads_ = 0;
  upload_bytes_ = 0;
  upload_seconds_ = 0;
  collectives_.ResetStats();
}

void ChunkPager::Materialize(int c) {
  DeviceBuffer& buffer = buffers_[home_[c]];
  streams_.WaitOnCompute(buffer.ready);
  WaitGather(buffer);
  if (materialized_[c]) return;
  for (int i : set_.chunk(c).params) {
    Param& p = set_.param(i);
    p.tensor.set_data(set_.ParamView(buffer.storage, p));
  }
  materialized_[c] = true;
}

void ChunkPager::Dematerialize(int c) {
  if (!materialized_[c]) return;
  for (int i : set_.chunk(c).params) {
    Param& p = set_.param(i);
    p.tensor.set_data(set_.Placeholder(p));
  }
  materialized_[c] = false;
}

bool ChunkPager::Acquire(int group, bool forward) {
  if (group < 0 || group >= set_.num_groups()) {
    MEMPLAN_LOG(kError, "chunk manager hook for an unknown group").Field("group", group);
    return false;
  }
  torch::NoGradGuard no_grad;
  const std::vector<int>& needed = set_.group_chunks(group);
  const int next = forward ? group + 1 : group - 1;
  const bool has_next = next >= 0 && next < set_.num_groups();
  // [Sharded persistent parameters]: what neither this group nor the next uses goes first, so
  // that its memory serves the gathers below.
  const std::vector<int>& pneeded = set_.group_pchunks(group);
  static const std::vector<int> kNone;
  const std::vector<int>& pnext = has_next ? set_.group_pchunks(next) : kNone;
  for (int c = 0; c < set_.n_persist(); ++c) {
    if (!gathered_[c]) continue;
    if (std::find(pneeded.begin(), pneeded.end(), c) != pneeded.end()) continue;
    if (std::find(pnext.begin(), pnext.end(), c) != pnext.end()) continue;
    ReleasePersistent(c);
  }
  for (int c : pneeded) GatherPersistent(c);
  for (int c : needed) Upload(c);
  if (set_.sharded()) collectives_.FlushGathers();
  for (int c : pneeded) WaitPersistent(c);
  for (int c : needed) Materialize(c);
  return true;
}

void ChunkPager::Prefetch(int group, bool forward) {
  torch::NoGradGuard no_grad;
  const std::vector<int>& needed = set_.group_chunks(group);
  const int next = forward ? group + 1 : group - 1;
  // Prefetch the next group in this direction on the upload stream, without evicting anything
  // this group is about to use.
  if (next < 0 || next >= set_.num_groups()) return;
  for (int c : set_.group_pchunks(next)) GatherPersistent(c);
  for (int c : set_.group_chunks(next)) {
    const int holder = buffers_[home_[c]].chunk;
    if (holder == c) continue;
    if (holder >= 0 && std::find(needed.begin(), needed.end(), holder) != needed.end()) continue;
    Upload(c);
  }
  if (set_.sharded()) collectives_.FlushGathers();
}

void ChunkPager::WaitGather(DeviceBuffer& buffer) {
  const absl::Status s = FinishGather(buffer);
  if (!s.ok()) collectives_.FailCollective(s);
}

absl::Status ChunkPager::FinishGather(DeviceBuffer& buffer) {
  const absl::Status status = collectives_.FinishBatch(buffer.gather);
  buffer.gather_src = torch::Tensor();
  return status;
}

void ChunkPager::FinishGatherOf(int c) {
  DeviceBuffer& buffer = buffers_[home_[c]];
  if (buffer.chunk == c) (void)FinishGather(buffer);
}

void ChunkPager::StartGather(int c, DeviceBuffer& buffer) {
  WaitGather(buffer);  // the buffer's previous all-gather may still write it
  const Chunk& chunk = set_.chunk(c);
  torch::Tensor src = ChunkSet::HostFlat(chunk.param_host.data(), 0, chunk.shard_elems,
                                         set_.dtype());
  torch::Tensor dst = buffer.storage.narrow(0, 0, chunk.padded_elems);
  buffer.ready = nullptr;
  buffer.gather = collectives_.JoinGatherBatch(chunk.padded_elems * set_.elem_size());
  GatherBatch& batch = *buffer.gather;
#ifdef MEMPLAN_CHUNKS_CUDA
  if (set_.cuda()) {
    // The buffer's previous chunk may still be read by kernels queued on the compute stream; the
    // collective is ordered after the current (upload) stream, hence after the shard's copy.
    streams_.RecordOnCompute()->block(streams_.upload());
    c10::cuda::CUDAStreamGuard guard(streams_.upload());
    buffer.gather_src = torch::empty({chunk.shard_elems}, set_.DeviceOptions());
    buffer.gather_src.copy_(src, /*non_blocking=*/true);
    auto copied = std::make_shared<Event>();
    copied->record(streams_.upload());
    uploaded_[c] = copied;  // the CPU update must not overwrite param_host before the copy
    batch.outputs.push_back(dst);
    batch.inputs.push_back(buffer.gather_src);
    if (!set_.options().coalesce_gathers) collectives_.FlushGathers();
    return;
  }
#endif
  batch.outputs.push_back(dst);
  batch.inputs.push_back(src);
  if (!set_.options().coalesce_gathers) collectives_.FlushGathers();
}

void ChunkPager::GatherPersistent(int c) {
  if (gathered_[c]) return;
  Chunk& chunk = set_.chunk(c);
  set_.AttachPersistentMemory(c);
  gathered_[c] = true;
  ++persistent_gathers_;
  gather_[c] = collectives_.JoinGatherBatch(chunk.padded_elems * set_.elem_size());
  gather_[c]->outputs.push_back(chunk.device);
  gather_[c]->inputs.push_back(chunk.param_shard);
#ifdef MEMPLAN_CHUNKS_CUDA
  // The memory may be a block the compute stream released with readers still queued: the
  // collective (ordered after the upload stream) starts after them.
  if (set_.cuda()) streams_.RecordOnCompute()->block(streams_.upload());
#endif
  if (!set_.options().coalesce_gathers) collectives_.FlushGathers();
}

void ChunkPager::WaitPersistent(int c) {
  const absl::Status s = collectives_.FinishBatch(gather_[c]);  // the compute stream waits
  if (!s.ok()) collectives_.FailCollective(s);
}

void ChunkPager::ReleasePersistent(int c) {
  // The collective must not outlive its output; a failure is kept for Step().
  (void)collectives_.FinishBatch(gather_[c]);
  set_.DetachPersistentMemory(c);
  gathered_[c] = false;
}

void ChunkPager::ReleaseAllPersistent() {
  for (int c = 0; c < set_.n_persist(); ++c) {
    if (set_.chunk(c).params_sharded && gathered_[c]) ReleasePersistent(c);
  }
}

void ChunkPager::FinishGathers() {
  for (DeviceBuffer& buffer : buffers_) (void)FinishGather(buffer);
  for (std::shared_ptr<GatherBatch>& gather : gather_) (void)collectives_.FinishBatch(gather);
}

void ChunkPager::WaitStartedGathers() {
  auto wait_started = [](const std::shared_ptr<GatherBatch>& gather) {
    if (gather && gather->work && !gather->waited) {
      gather->waited = true;
      (void)gather->work->Wait();
    }
  };
  for (DeviceBuffer& buffer : buffers_) wait_started(buffer.gather);
  for (const std::shared_ptr<GatherBatch>& gather : gather_) wait_started(gather);
}

void ChunkPager::InvalidateBuffers() {
  ReleaseAllPersistent();  // [Sharded persistent parameters]: gathered again from the shards
  for (DeviceBuffer& buffer : buffers_) {
    (void)FinishGather(buffer);
    if (buffer.chunk >= 0) Dematerialize(buffer.chunk);
    buffer.chunk = -1;
    buffer.ready = nullptr;
  }
}

}  // namespace memplan::chunks
