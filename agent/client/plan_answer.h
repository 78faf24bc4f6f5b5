// Plain-struct facade of the planner's Plan RPC for the agent: what is asked (PlanQuery) and what
// comes back (PlanAnswer), free of protobuf and Torch so Torch code can hold them.
// Thread-compatible value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/types.h"

namespace memplan {

// Exactly one model source (arch, trace_id, arch_preset) and exactly one hardware source
// (hardware, hardware_profile_id, hardware_preset) must be set.
struct PlanQuery {
  std::optional<ModelSpec> arch;
  std::string trace_id;     // a trace stored by SubmitTrace
  std::string arch_preset;  // e.g. "llama-3.2-1b"
  std::optional<HardwareSpec> hardware;
  std::string hardware_profile_id;  // a profile stored by SubmitHardwareProfile
  std::string hardware_preset;      // e.g. "h100-80gb"
  Workload workload;
  TrainingMethod training;
  DType param_dtype = DType::kBFloat16;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  FixedKnobs fixed;
  double safety_margin = 0;      // 0: the planner's default (common/safety_margin.h)
  bool skip_limits = false;      // skip max batch / max seq / min memory
  int32_t max_alternatives = 0;  // 0: the planner's default
};

struct PlanAlternative {
  ResidencyPlan plan;
  Prediction prediction;
  std::string note;
};

struct PlanAnswer {
  bool fits = false;
  std::string reason;
  ResidencyPlan plan;  // default-constructed when the planner sent no usable plan (fits = false)
  Prediction prediction;
  int64_t max_micro_batch = 0;
  int64_t max_seq_len = 0;
  int64_t min_gpu_memory_bytes = 0;
  std::vector<PlanAlternative> alternatives;
  std::string plan_id;
  std::string trace_id;  // the trace the prediction used
  bool analytic_trace = true;
  int64_t capacity_bytes = 0;
  double search_seconds = 0;
  int64_t plans_evaluated = 0;
};

// What ReportMeasurement answers.
struct MeasurementReceipt {
  std::string measurement_id;
  // (predicted - measured) / measured, reserved peak (common/relative_error.h); none for an OOM.
  std::optional<double> relative_error;
  Calibration calibration;    // after this measurement (unchanged when quarantined)
  // Non-empty: the planner stored the measurement but kept it out of calibration; why.
  std::string quarantine_reason;
};

}  // namespace memplan
