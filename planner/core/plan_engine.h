// Planner entry point: validates a planning request, builds the trace (analytic or profiled),
// searches residency plans, and computes the workload limits. Pure computation: no I/O, no clock.
// Thread-safe: free functions over value inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safety_margin.h"
#include "common/types.h"

namespace memplan {

struct PlanInputs {
  ModelSpec arch;                       // validated by the engine
  std::optional<Trace> profiled_trace;  // when set, used instead of the analytic trace
  HardwareSpec hardware;
  Workload workload;
  TrainingMethod training;
  DType param_dtype = DType::kBFloat16;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  FixedKnobs fixed;
  double safety_margin = kDefaultSafetyMargin;  // CheckSafetyMargin's range (common/)
  int max_alternatives = 5;
  bool skip_limits = false;           // skip max batch / max seq / min memory
  double fragmentation_factor = 1.0;  // from calibration (alpha)
  int64_t residual_bytes = 0;         // from calibration
  double time_factor = 1.0;           // from calibration: measured / predicted step time
};

struct PlanOutcome {
  bool fits = false;
  std::string reason;  // why it fits / why not (human readable, specific)
  ResidencyPlan plan;  // best plan (or the least-bad one when !fits)
  Prediction prediction;
  std::vector<std::pair<ResidencyPlan, Prediction>> alternatives;  // memory/speed frontier
  std::vector<std::string> alternative_notes;
  int64_t max_micro_batch = 0;       // at this seq_len, 0 = not even 1
  int64_t max_seq_len = 0;           // at this micro_batch
  int64_t min_gpu_memory_bytes = 0;  // smallest card (same other figures) that fits
  int64_t capacity_bytes = 0;        // usable bytes after margin
  int64_t plans_evaluated = 0;
  Trace trace_used;  // analytic or profiled
};

// Validates every input (INVALID_ARGUMENT naming the field, e.g. "fixed.n_persist = 99 is out of
// range; allowed [0, 40]", "safety_margin", "workload.seq_len"), builds the trace, searches the
// plan space and (unless skip_limits) computes max micro-batch, max seq_len and min GPU memory.
//
// Calibration contract: every Prediction satisfies
//   peak_bytes = exact_bytes + ceil(alpha * (raw_bytes - exact_bytes)) + residual_bytes +
//                cuda_context_bytes
// where alpha = fragmentation_factor (recorded in breakdown.fragmentation_factor), residual =
// residual_bytes (breakdown.calibration_residual_bytes), raw_bytes is the sum of the model's
// breakdown components (persistent chunks, buffers, grads, optimizer state, activations,
// checkpoint chain, transients) and exact_bytes (breakdown.exact_bytes) the part of them allocated
// once at its exact size (persistent chunks with their optimizer state, chunk buffers, grad
// staging), which the factor does not scale. RawModelBytes() recovers raw_bytes from a Prediction.
//
// A fully trained vision tower whose plan fits nowhere as asked is planned again with its blocks
// checkpointed (workload.vision_checkpoint); plan.vision_checkpoint says which was chosen.
absl::StatusOr<PlanOutcome> MakePlan(const PlanInputs& inputs);

// Prediction for one given plan (used to re-predict a stored plan, e.g. for calibration). The plan
// is validated against the trace (chunk count, n_persist range, block_modes length...).
// plan.vision_checkpoint prices the vision tower's blocks checkpointed.
absl::StatusOr<Prediction> PredictPlan(const PlanInputs& inputs, const ResidencyPlan& plan);

// The one check of a trace, profiled or submitted: every figure in range (bytes [0, 2^50],
// seconds [0, 1e7]), one block per layer, the model, workload and training valid, names, ids and
// chunk_param_bytes bounded (common/validate.h). INVALID_ARGUMENT names the field with `prefix`.
absl::Status ValidateTrace(const Trace& trace, absl::string_view prefix);

// The chunk sizes the search tries for `trace`: fixed.chunk_bytes when set, else
// kDefaultChunkCandidatesBytes plus, for models whose block matrices are larger than all of them,
// the smallest power of two holding the largest one and twice that.
std::vector<int64_t> ChunkCandidates(const FixedKnobs& fixed, const Trace& trace);

// raw_bytes of the calibration contract: the sum of persistent_chunks, buffers, grads,
// optimizer_state, activations, checkpoint_chain and transient bytes of prediction.breakdown
// (exact_bytes is part of it).
int64_t RawModelBytes(const Prediction& prediction);

}  // namespace memplan
