// ChunkSet: the bottom layer of the ChunkManager. Owns the parameters, the chunk layout and the
// parameters' storage (persistent chunks' flat device tensors and shards, offloaded chunks' host
// copies) and gives views into them. Promise: after Init() each value this rank stores is in
// exactly one place, and every parameter views its persistent chunk or is a placeholder; it
// moves nothing between host and device afterwards. Not thread-safe. Private to agent/chunks
// (the layers: README.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/chunks/chunk_manager.h"
#include "agent/chunks/host_buffer.h"
#include "agent/core/torch_pch.h"
#include "common/chunk_packing.h"

namespace memplan::chunks {

// A c10::Error as a Status, at the edge where LibTorch is called.
absl::Status TorchError(const c10::Error& e, absl::string_view what);

// One distinct parameter tensor and its place in the layout.
struct Param {
  std::string name;
  torch::Tensor tensor;  // the model's parameter; identity is what ties aliases together
  std::vector<int64_t> shape;
  int64_t numel = 0;
  // The parameter's own dtype: the storage dtype, except in [Byte chunks].
  torch::ScalarType dtype = torch::kFloat32;
  int chunk = 0;
  int64_t offset_elems = 0;  // into the chunk's arrays (offset_bytes / storage element size)
  int first_group = 0;       // backward touches it last here: its grad is final after this group
};

// The chunk arrays' dtype: the parameters' one, or bytes when they differ ([Byte chunks] in
// chunk_manager.cc).
torch::ScalarType StorageDType(const std::vector<Param>& params);

// One chunk of the layout and where its parameters are stored.
struct Chunk {
  bool persistent = false;
  int64_t size_bytes = 0;
  int64_t span_elems = 0;
  // [Sharded chunks]: this rank's elements [shard_begin, shard_begin + shard_elems) of the padded
  // chunk (padded_elems); unsharded: the whole chunk.
  int64_t shard_begin = 0;
  int64_t shard_elems = 0;
  int64_t padded_elems = 0;
  std::vector<int> params;
  int completion_group = 0;  // smallest first_group of its params
  torch::Tensor device;      // persistent: the flat parameter storage
  // Non-persistent: this rank's parameters in the model dtype, laid out like the chunk; the
  // upload source (and the updated parameter without a master).
  HostBuffer param_host;
  // [Sharded persistent state]: a persistent chunk whose optimizer state is sharded.
  bool state_sharded = false;
  // [Sharded persistent parameters]: this rank's shard of the parameters (model dtype, on the
  // device); `device` then holds memory only while gathered (ChunkPager).
  bool params_sharded = false;
  torch::Tensor param_shard;
  // Every rank holds the whole chunk's parameters (a persistent chunk whose parameters are not
  // sharded).
  bool params_replicated() const { return persistent && !params_sharded; }
};

// The part of a parameter held in a chunk's arrays ([Sharded chunks]): elements
// [from, from + len) of the flattened parameter, at element `at` of the arrays.
struct OwnedRange {
  int64_t from = 0;
  int64_t at = 0;
  int64_t len = 0;
};

class ChunkSet {
 public:
  // `world` / `rank`: the communicator's (1 / 0 without one); `options` outlive the set.
  ChunkSet(const ChunkManagerOptions& options, ChunkPacking layout, int world, int rank);

  // Called once per chunk, in chunk order, right after its parameters are stored (and before a
  // persistent chunk's parameters are sharded): what the layers above allocate per chunk.
  using ChunkStored = std::function<absl::Status(int chunk)>;
  // Moves every parameter's value into its chunk (or zeros, options.deferred_values): views of
  // the persistent chunks' device tensors, placeholders for the others. Then the per-group
  // tables. c10::Error is returned as a Status.
  absl::Status Init(const ParamGroups& groups, std::vector<Param> params,
                    std::vector<std::vector<int>> group_params, const ChunkStored& stored);

  const ChunkManagerOptions& options() const { return options_; }
  const ChunkPacking& layout() const { return layout_; }
  int world() const { return world_; }
  int rank() const { return rank_; }
  bool sharded() const { return world_ > 1; }
  bool cuda() const { return options_.device.is_cuda(); }
  // Parameters only: no gradient staging, master or optimizer state (profile_only, frozen).
  bool stateless() const { return options_.profile_only || options_.frozen; }
  torch::ScalarType dtype() const { return dtype_; }
  int64_t elem_size() const { return static_cast<int64_t>(torch::elementSize(dtype_)); }
  torch::TensorOptions DeviceOptions() const {
    return torch::TensorOptions().dtype(dtype_).device(options_.device);
  }

  int n_persist() const { return n_persist_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  int num_groups() const { return static_cast<int>(group_params_.size()); }
  int num_params() const { return static_cast<int>(params_.size()); }
  Param& param(int i) { return params_[i]; }
  const Param& param(int i) const { return params_[i]; }
  Chunk& chunk(int c) { return chunks_[c]; }
  const Chunk& chunk(int c) const { return chunks_[c]; }
  // Per group: its parameters (indices), the non-persistent chunks it needs resident, the
  // persistent chunks gathered on use ([Sharded persistent parameters]) and the parameters whose
  // grads move to the host after it.
  const std::vector<int>& group_params(int g) const { return group_params_[g]; }
  const std::vector<int>& group_chunks(int g) const { return group_chunks_[g]; }
  const std::vector<int>& group_pchunks(int g) const { return group_pchunks_[g]; }
  const std::vector<int>& group_stage(int g) const { return group_stage_[g]; }
  // The parameter a name (aliases included) refers to, or -1.
  int ParamIndex(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? -1 : it->second;
  }
  // Shared buffers every group's non-persistent chunks need at once.
  int min_buffers() const { return min_buffers_; }

  // p's length in the chunk arrays' elements: numel, or its bytes in [Byte chunks].
  int64_t StorageElems(const Param& p) const {
    if (p.dtype == dtype_) return p.numel;
    return p.numel * static_cast<int64_t>(torch::elementSize(p.dtype)) / elem_size();
  }
  // Ranges count the chunk arrays' elements (bytes in [Byte chunks]).
  OwnedRange Owned(const Param& p, const Chunk& chunk) const {
    const int64_t lo = std::max(p.offset_elems, chunk.shard_begin);
    const int64_t hi =
        std::min(p.offset_elems + StorageElems(p), chunk.shard_begin + chunk.shard_elems);
    if (hi <= lo) return OwnedRange{};
    return OwnedRange{lo - p.offset_elems, lo - chunk.shard_begin, hi - lo};
  }
  // The elements of p this rank stores: the whole parameter in a persistent chunk (replicated),
  // else its part of this rank's shard ([Sharded persistent parameters] included).
  OwnedRange Stored(const Param& p) const {
    const Chunk& chunk = chunks_[p.chunk];
    return chunk.params_replicated() ? OwnedRange{0, 0, StorageElems(p)} : Owned(p, chunk);
  }
  // The elements of p's optimizer state this rank stores: Stored(p), except in a persistent chunk
  // whose state is sharded ([Sharded persistent state]): its part of the shard.
  OwnedRange StateStored(const Param& p) const {
    const Chunk& chunk = chunks_[p.chunk];
    return chunk.state_sharded ? Owned(p, chunk) : Stored(p);
  }

  // p's slot in a flat parameter array of its chunk (device or host, in the storage dtype), as a
  // tensor of p's dtype and shape: a reinterpreting view in [Byte chunks].
  torch::Tensor ParamView(const torch::Tensor& flat, const Param& p) const;
  // The same over a host array.
  torch::Tensor ParamHostView(void* data, const Param& p) const;
  // What a released parameter holds: a 0-dim zero of its dtype expanded to its shape.
  torch::Tensor Placeholder(const Param& p) const;
  static torch::Tensor HostView(void* data, int64_t offset_elems,
                                const std::vector<int64_t>& shape, int64_t numel,
                                torch::ScalarType dtype);
  // A flat view of `len` elements at element `at` of a host array.
  static torch::Tensor HostFlat(void* data, int64_t at, int64_t len, torch::ScalarType dtype) {
    return HostView(data, at, {len}, len, dtype);
  }

  // Host memory for transfers (parameters, grad staging): pinned when asked for, else (or when
  // pinning fails and options.pageable_fallback) pageable; counted in the host stats.
  absl::StatusOr<HostBuffer> AllocateTransfer(int64_t bytes);
  // Counts a host buffer in the stats (pinned or pageable as it is).
  void CountHost(const HostBuffer& buffer);

  // [Sharded persistent parameters]: gives chunk c's flat tensor P elements from the caching
  // allocator (on the current stream), keeping its storage object; Detach gives them back.
  void AttachPersistentMemory(int c);
  void DetachPersistentMemory(int c);

  // Layout, parameter and host figures; the layers above fill in their own.
  const ChunkMemoryStats& stats() const { return stats_; }

 private:
  const ChunkManagerOptions& options_;
  ChunkPacking layout_;
  int world_ = 1;
  int rank_ = 0;
  torch::ScalarType dtype_ = torch::kFloat32;
  int n_persist_ = 0;
  int min_buffers_ = 0;
  std::vector<Param> params_;                     // canonical order
  std::vector<std::vector<int>> group_params_;    // per group, indices into params_
  std::vector<std::vector<int>> group_chunks_;    // per group, non-persistent chunks it needs
  std::vector<std::vector<int>> group_pchunks_;   // per group, persistent chunks gathered on use
  std::vector<std::vector<int>> group_stage_;     // per group, params whose grad is offloaded there
  std::unordered_map<std::string, int> by_name_;  // every name, aliases included
  std::vector<Chunk> chunks_;
  torch::Tensor placeholder_;  // 0-dim, expanded to each released parameter's shape
  // [Byte chunks] the same for each parameter dtype other than the storage dtype.
  std::map<torch::ScalarType, torch::Tensor> other_placeholders_;
  ChunkMemoryStats stats_;
};

}  // namespace memplan::chunks
