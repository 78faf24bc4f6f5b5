#include "agent/chunks/chunk_set.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chunk_packing.h"
#include "common/log.h"
#include "common/optimizer_bytes.h"
#include "common/status.h"

namespace memplan::chunks {

absl::Status TorchError(const c10::Error& e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(std::string(what), ": ", e.what_without_backtrace()));
}

torch::ScalarType StorageDType(const std::vector<Param>& params) {
  if (params.empty()) return torch::kFloat32;
  for (const Param& p : params) {
    if (p.dtype != params[0].dtype) return torch::kUInt8;
  }
  return params[0].dtype;
}

ChunkSet::ChunkSet(const ChunkManagerOptions& options, ChunkPacking layout, int world, int rank)
    : options_(options), layout_(std::move(layout)), world_(world), rank_(rank) {}

absl::Status ChunkSet::Init(const ParamGroups& groups, std::vector<Param> params,
                            std::vector<std::vector<int>> group_params,
                            const ChunkStored& stored) {
  params_ = std::move(params);
  group_params_ = std::move(group_params);
  dtype_ = StorageDType(params_);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const NamedParam& named : groups[g]) {
      for (int i : group_params_[g]) {
        if (params_[i].tensor.unsafeGetTensorImpl() == named.param.unsafeGetTensorImpl()) {
          by_name_.emplace(named.name, i);
        }
      }
    }
  }
  n_persist_ = std::clamp(options_.n_persist, 0, layout_.num_chunks());
  const int64_t elem_bytes = torch::elementSize(dtype_);

  chunks_.resize(layout_.num_chunks());
  for (int c = 0; c < layout_.num_chunks(); ++c) {
    Chunk& chunk = chunks_[c];
    const ChunkInfo& info = layout_.chunks()[c];
    chunk.persistent = c < n_persist_;
    chunk.size_bytes = info.size_bytes;
    chunk.span_elems = info.size_bytes / elem_bytes;
    chunk.shard_elems = chunk.span_elems;
    chunk.padded_elems = chunk.span_elems;
    chunk.state_sharded =
        sharded() && chunk.persistent && options_.shard_persistent_state && !stateless();
    // [Sharded frozen base] a frozen chunk has no state to shard: its parameters alone.
    chunk.params_sharded =
        options_.shard_persistent_params &&
        (chunk.state_sharded || (sharded() && chunk.persistent && options_.frozen));
    if (sharded() && (!chunk.persistent || chunk.state_sharded || chunk.params_sharded)) {
      chunk.shard_elems = ShardElems(chunk.span_elems, world_);
      chunk.shard_begin = rank_ * chunk.shard_elems;
      chunk.padded_elems = PaddedElems(chunk.span_elems, world_);
    }
    chunk.completion_group = std::numeric_limits<int>::max();
    stats_.chunk_bytes.push_back(info.size_bytes);
  }
  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    Chunk& chunk = chunks_[params_[i].chunk];
    chunk.params.push_back(i);
    chunk.completion_group = std::min(chunk.completion_group, params_[i].first_group);
  }

  // Values are copied before any parameter is swapped out.
  try {
    placeholder_ = torch::zeros({}, DeviceOptions());
    for (const Param& p : params_) {
      if (p.dtype != dtype_ && !other_placeholders_.count(p.dtype)) {
        other_placeholders_[p.dtype] = torch::zeros({}, DeviceOptions().dtype(p.dtype));
      }
    }
    torch::NoGradGuard no_grad;
    for (int c = 0; c < layout_.num_chunks(); ++c) {
      Chunk& chunk = chunks_[c];
      if (chunk.persistent) {
        // [Sharded persistent state]: padded, the all-gather's output.
        chunk.device = torch::zeros({chunk.padded_elems}, DeviceOptions());
        for (int i : chunk.params) {
          Param& p = params_[i];
          torch::Tensor view = ParamView(chunk.device, p);
          if (!options_.deferred_values) view.copy_(p.tensor.detach());
          p.tensor.set_data(view);
        }
        stats_.persistent_device_bytes +=
            (chunk.params_sharded ? chunk.shard_elems : chunk.padded_elems) * elem_bytes;
        // The state above reads the whole chunk (an fp32 master) before it is sharded.
        RETURN_IF_ERROR(stored(c));
        if (chunk.params_sharded) {
          // [Sharded persistent parameters]: keep this rank's shard; the flat tensor gives its
          // memory back until a group needs the chunk.
          chunk.param_shard = chunk.device.narrow(0, chunk.shard_begin, chunk.shard_elems).clone();
          DetachPersistentMemory(c);
        }
        continue;
      }
      ASSIGN_OR_RETURN(chunk.param_host, AllocateTransfer(chunk.shard_elems * elem_bytes));
      CountHost(chunk.param_host);
      if (stateless()) {
        // [Sharded frozen base] this rank's part of each parameter, in the arrays' units (bytes
        // in [Byte chunks]: a shard boundary may cut an NF4 weight, its codes being bytes).
        for (int i : chunk.params) {
          Param& p = params_[i];
          const OwnedRange r = Owned(p, chunk);
          if (r.len > 0) {
            torch::Tensor host = HostFlat(chunk.param_host.data(), r.at, r.len, dtype_);
            if (options_.deferred_values) {
              host.zero_();
            } else {
              torch::Tensor value = p.tensor.detach().to(torch::kCPU).contiguous().reshape({-1});
              if (p.dtype != dtype_) value = value.view(dtype_);
              host.copy_(value.narrow(0, r.from, r.len));
            }
          }
          p.tensor.set_data(Placeholder(p));
        }
      } else {
        for (int i : chunk.params) {
          Param& p = params_[i];
          const OwnedRange r = Owned(p, chunk);
          if (r.len > 0 && options_.deferred_values) {
            // [Sharded loading] no values yet: zeros until LoadRanges fills this rank's part.
            HostFlat(chunk.param_host.data(), r.at, r.len, dtype_).zero_();
          } else if (r.len > 0) {
            torch::Tensor value =
                p.tensor.detach().to(torch::kCPU).reshape({-1}).narrow(0, r.from, r.len);
            HostFlat(chunk.param_host.data(), r.at, r.len, dtype_).copy_(value);
          }
          p.tensor.set_data(Placeholder(p));
        }
      }
      RETURN_IF_ERROR(stored(c));
    }
  } catch (const c10::Error& e) {
    return TorchError(e, "copying parameters into chunks");
  }

  // Which non-persistent chunks each group needs resident, and whose grads become final where.
  group_chunks_.assign(group_params_.size(), {});
  group_pchunks_.assign(group_params_.size(), {});
  // A parameter used by several groups (a tied LM head) gets one autograd accumulation per
  // group. With one micro-batch the device sums them in autograd's order and the grad moves once,
  // after its last group; with several, the host must add the contributions in that same order
  // ((h1 + e1) + h2) + e2, so the grad moves after every group that uses it.
  group_stage_.assign(group_params_.size(), {});
  for (size_t g = 0; g < group_params_.size(); ++g) {
    std::set<int> needed, gathered;
    for (int i : group_params_[g]) {
      if (!chunks_[params_[i].chunk].persistent) needed.insert(params_[i].chunk);
      if (chunks_[params_[i].chunk].params_sharded) gathered.insert(params_[i].chunk);
      if (options_.grad_accum > 1 || params_[i].first_group == static_cast<int>(g)) {
        group_stage_[g].push_back(i);
      }
    }
    group_chunks_[g].assign(needed.begin(), needed.end());
    group_pchunks_[g].assign(gathered.begin(), gathered.end());
    int shared = 0;  // oversized chunks have buffers of their own
    for (int c : needed) shared += layout_.chunks()[c].oversized ? 0 : 1;
    min_buffers_ = std::max(min_buffers_, shared);
  }
  // [Sharded persistent parameters]: the most held at once, a group's chunks and the next one's
  // (PersistentGatherBytesByNPersist, common/chunk_packing.h: the planner's rule too), over the
  // chunks this manager's groups really use. Every persistent chunk is sharded or none is.
  if (std::any_of(chunks_.begin(), chunks_.end(),
                  [](const Chunk& chunk) { return chunk.params_sharded; })) {
    std::vector<std::vector<int>> used(group_params_.size());
    for (size_t g = 0; g < group_params_.size(); ++g) {
      for (int i : group_params_[g]) used[g].push_back(params_[i].chunk);
    }
    std::vector<int64_t> gathered(chunks_.size());
    for (size_t c = 0; c < chunks_.size(); ++c) gathered[c] = chunks_[c].padded_elems * elem_bytes;
    stats_.persistent_gather_device_bytes =
        PersistentGatherBytesByNPersist(used, gathered)[n_persist_];
  }
  stats_.world_size = world_;
  stats_.n_chunks = layout_.num_chunks();
  stats_.layout_fingerprint = layout_.fingerprint();
  stats_.n_persist = n_persist_;
  stats_.layout_bytes = layout_.TotalBytes();
  return absl::OkStatus();
}

torch::Tensor ChunkSet::ParamView(const torch::Tensor& flat, const Param& p) const {
  if (p.dtype == dtype_) return flat.narrow(0, p.offset_elems, p.numel).view(p.shape);
  const int64_t len = p.numel * static_cast<int64_t>(torch::elementSize(p.dtype)) / elem_size();
  return flat.narrow(0, p.offset_elems, len).view(p.dtype).view(p.shape);
}

torch::Tensor ChunkSet::ParamHostView(void* data, const Param& p) const {
  char* base = static_cast<char*>(data) + p.offset_elems * elem_size();
  return torch::from_blob(base, {p.numel}, torch::TensorOptions().dtype(p.dtype)).view(p.shape);
}

torch::Tensor ChunkSet::Placeholder(const Param& p) const {
  if (p.dtype == dtype_) return placeholder_.expand(p.shape);
  return other_placeholders_.at(p.dtype).expand(p.shape);
}

torch::Tensor ChunkSet::HostView(void* data, int64_t offset_elems,
                                 const std::vector<int64_t>& shape, int64_t numel,
                                 torch::ScalarType dtype) {
  char* base = static_cast<char*>(data) + offset_elems * torch::elementSize(dtype);
  return torch::from_blob(base, {numel}, torch::TensorOptions().dtype(dtype)).view(shape);
}

absl::StatusOr<HostBuffer> ChunkSet::AllocateTransfer(int64_t bytes) {
  if (options_.host_memory == HostMemoryKind::kPageable || stats_.pinned_fallback) {
    return HostBuffer::AllocatePageable(bytes);
  }
  absl::StatusOr<HostBuffer> pinned = HostBuffer::AllocatePinned(bytes);
  if (pinned.ok()) return pinned;
  if (!options_.pageable_fallback) {
    return absl::Status(pinned.status().code(),
                        absl::StrCat("host_memory=pinned: ", pinned.status().message(),
                                     " (set pageable_fallback to use pageable memory)"));
  }
  stats_.pinned_fallback = true;
  stats_.pinned_fallback_reason = std::string(pinned.status().message());
  MEMPLAN_LOG(kWarning, "pinned host memory unavailable; using pageable memory for chunks")
      .Field("reason", stats_.pinned_fallback_reason)
      .Field("bytes", bytes);
  return HostBuffer::AllocatePageable(bytes);
}

void ChunkSet::CountHost(const HostBuffer& buffer) {
  (buffer.pinned() ? stats_.host_pinned_bytes : stats_.host_pageable_bytes) +=
      buffer.size_bytes();
}

void ChunkSet::AttachPersistentMemory(int c) {
  Chunk& chunk = chunks_[c];
  // The memory comes from the caching allocator on the current (compute) stream; its storage
  // object is the one the parameters and autograd's saved views point into.
  c10::StorageImpl* storage = chunk.device.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(chunk.padded_elems * elem_size());
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void ChunkSet::DetachPersistentMemory(int c) {
  Chunk& chunk = chunks_[c];
  c10::StorageImpl* storage = chunk.device.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, chunk.device.device()));
  storage->set_nbytes(0);
}

}  // namespace memplan::chunks
