#include "agent/profiler/on_demand_profiler.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/chunks/chunk_manager.h"
#include "common/log.h"
#include "common/status.h"

namespace memplan {
namespace {

int64_t LargestGroupBytes(const ParamGroups& groups) {
  int64_t largest = 0;
  for (const std::vector<NamedParam>& group : groups) {
    int64_t bytes = 0;
    for (const NamedParam& p : group) bytes += p.param.numel() * p.param.element_size();
    largest = std::max(largest, bytes);
  }
  return largest;
}

}  // namespace

absl::StatusOr<OnDemandProfile> ProfileModelOnDemand(LlamaModel& model,
                                                     const ProfilerOptions& options,
                                                     const OnDemandOptions& on_demand) {
  const LlamaModelOptions& mo = model.options();
  if (!mo.param_device.has_value() || !mo.param_device->is_cpu()) {
    return absl::InvalidArgumentError(
        "on-demand profiling needs a model created with param_device = cpu");
  }
  if (on_demand.chunk_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes = ", on_demand.chunk_bytes, " must be >= 0"));
  }
  if (on_demand.n_buffer < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_buffer = ", on_demand.n_buffer, " must be >= 1"));
  }
  const ParamGroups groups = model.ParamGroups();
  int64_t chunk_bytes = on_demand.chunk_bytes;
  if (chunk_bytes == 0) {
    chunk_bytes = int64_t{1} << 20;
    while (chunk_bytes < LargestGroupBytes(groups)) chunk_bytes *= 2;
  }
  ChunkManagerOptions cm;
  cm.chunk_bytes = chunk_bytes;
  cm.n_persist = 0;
  cm.n_buffer = on_demand.n_buffer;
  cm.host_memory = on_demand.host_memory;
  cm.pageable_fallback = true;
  cm.device = mo.device;
  cm.cpu_threads = 0;
  cm.max_grad_norm = 0;
  cm.profile_only = true;
  ASSIGN_OR_RETURN(std::unique_ptr<ChunkManager> manager, ChunkManager::Create(groups, cm));
  const ChunkMemoryStats stats = manager->MemoryStats();
  MEMPLAN_LOG(kInfo, "on-demand profiling: parameters in host memory")
      .Field("chunk_bytes", chunk_bytes)
      .Field("chunks", stats.n_chunks)
      .Field("device_buffer_bytes", stats.buffer_device_bytes)
      .Field("host_pinned_bytes", stats.host_pinned_bytes)
      .Field("host_pageable_bytes", stats.host_pageable_bytes);

  ProfilerOptions profiler = options;
  profiler.inner = manager.get();
  ASSIGN_OR_RETURN(ProfileResult result, ProfileModel(model, profiler));
  OnDemandProfile out;
  out.result = std::move(result);
  out.chunk_bytes = chunk_bytes;
  out.n_chunks = stats.n_chunks;
  out.device_buffer_bytes = stats.buffer_device_bytes;
  out.host_bytes = stats.host_pinned_bytes + stats.host_pageable_bytes;
  out.pinned = stats.host_pinned_bytes > 0;
  return out;
}

}  // namespace memplan
