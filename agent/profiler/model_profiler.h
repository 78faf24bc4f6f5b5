// ProfileModel: one profiling pass of a LlamaModel at the user's workload, producing a memplan
// Trace (per-block forward/backward/recompute time, saved and input bytes, forward/backward
// transients, forward-end activation bytes, parameter bytes, chunk layout). Same code on CPU and
// CUDA; see agent/profiler/README.md for what each field measures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/core/torch_pch.h"
#include "agent/model/llama_model.h"
#include "agent/core/param_residency.h"
#include "common/types.h"

namespace memplan {

struct ProfilerOptions {
  // micro_batch, seq_len and a vision-language model's images are profiled; the rest is recorded
  Workload workload;
  std::string hardware_name;      // names the card in the trace (the planner matches on it)
  int warmup_steps = 1;           // untimed forward+backward passes first (kernels, allocator)
  bool measure_recompute = true;  // odd blocks run CKPT in the timed pass (see README)
  int64_t chunk_bytes = 0;        // > 0: record the chunk layout for this size in the trace
  uint64_t seed = 0;              // token ids of the profiling batch
  // Optional parameter manager, called around the profiler's own hooks (on-demand mode: e.g. a
  // ChunkManager that materialises one group's parameters at a time). Its transfers happen
  // outside the timed and measured windows. May be null.
  ParamResidency* inner = nullptr;
};

// What the profiler saw for one parameter group in the timed pass.
struct GroupMeasurement {
  double forward_seconds = 0;
  double backward_seconds = 0;      // recompute included when the group was checkpointed
  int64_t forward_start_bytes = 0;  // allocated, probe-relative (see MemoryProbe)
  int64_t forward_end_bytes = 0;
  int64_t forward_peak_bytes = 0;
  int64_t backward_start_bytes = 0;
  int64_t backward_end_bytes = 0;
  int64_t backward_peak_bytes = 0;
};

struct ProfileResult {
  Trace trace;
  std::vector<GroupMeasurement> groups;  // timed pass, 0 = embedding .. N+1 = head
  BlockModes block_modes;                // the mode each block ran in during the timed pass
  // Separate all-CKPT pass: only for a one-block model with measure_recompute (no pair to
  // interleave); empty otherwise.
  std::vector<GroupMeasurement> ckpt_groups;
  int passes = 0;            // forward + backward passes run, warm-ups included
  int64_t param_bytes = 0;   // every distinct parameter once, model dtype
  int64_t grad_bytes = 0;    // gradients alive after backward (0 when `inner` drops them)
  int64_t step_peak_bytes = 0;  // allocated peak over the timed pass, probe-relative
  double step_seconds = 0;      // forward + backward of the timed pass
  double warmup_seconds = 0;    // the warm-up passes (the process's first CUDA work included)
  double ckpt_step_seconds = 0;  // of the separate all-CKPT pass, when there was one
  std::string memory_source;     // MemoryProbe::source()
};

// Runs `warmup_steps` untimed passes and one timed pass, each a forward + backward of one random
// batch of workload.micro_batch x workload.seq_len tokens. With measure_recompute the odd blocks
// run CKPT in every pass and each CKPT block is paired with the NONE block before it (blocks
// share their shapes), so two passes give every per-block figure (see [Interleaved pass]).
// The trace describes the all-NONE model whatever ran. A vision-language model's batch holds the
// workload's images (synthetic, images_per_sample of image_height x image_width per sample), which
// the trace records ([Profiled images] in model_profiler.cc). Gradients the passes produce are
// cleared (the parameters are unchanged). INVALID_ARGUMENT for a bad workload (a vision-language
// model without images: naming workload.images_per_sample), RESOURCE_EXHAUSTED when the device
// runs out of memory.
absl::StatusOr<ProfileResult> ProfileModel(LlamaModel& model, const ProfilerOptions& options);

}  // namespace memplan
