// On-demand profiling (ProTrain §3.2) for models larger than the card: the model's parameters
// stay in host memory and a profile-only ChunkManager (agent/chunks) puts one group's chunks on
// the device around that group's hooks, outside the profiler's timed and measured windows. The
// per-group figures are those of the model with every parameter resident, so the trace is the
// same kind of trace ProfileModel gives for a model that fits (tests compare the two).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "agent/model/llama_model.h"
#include "agent/profiler/model_profiler.h"
#include "common/types.h"

namespace memplan {

struct OnDemandOptions {
  // Chunk size of the transfer layout; 0: the smallest power of two (>= 1 MiB) that holds the
  // largest group's parameters, so that a group moves as one chunk (oversized ones alone).
  int64_t chunk_bytes = 0;
  int n_buffer = 2;  // device buffers: the running group's chunk and the prefetched next one
  HostMemoryKind host_memory = HostMemoryKind::kPinned;  // falls back to pageable
};

struct OnDemandProfile {
  ProfileResult result;
  int64_t chunk_bytes = 0;         // the transfer layout's chunk size
  int n_chunks = 0;
  int64_t device_buffer_bytes = 0;  // what the parameters took on the device at most
  int64_t host_bytes = 0;           // parameters in host memory (pinned or pageable)
  bool pinned = false;
};

// `model` must have been created with param_device = CPU (LlamaModelOptions) and computes on its
// device. Its parameters are consumed (afterwards they are placeholders or views of a released
// chunk buffer), so use a model built for profiling only. Errors as ProfileModel, and those of ChunkManager::Create.
absl::StatusOr<OnDemandProfile> ProfileModelOnDemand(LlamaModel& model,
                                                     const ProfilerOptions& options,
                                                     const OnDemandOptions& on_demand);

}  // namespace memplan
