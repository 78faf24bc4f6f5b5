// Conversion between the wire messages of memplan.v1 and the domain structs of common/types.h.
// Domain -> proto never fails; proto -> domain fails with INVALID_ARGUMENT naming the field (with
// the caller's prefix, e.g. "trace.param_dtype") when an enum is unknown or a required enum is
// UNSPECIFIED. Range checks are not done here: that is common/validate.h. Thread-safe (pure).
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/types.h"
#include "memplan/v1/planner.pb.h"

namespace memplan {

// ---------------------------------------------------------------- enums
v1::DType ToProto(DType dtype);
v1::BlockMode ToProto(BlockMode mode);
v1::HostMemoryKind ToProto(HostMemoryKind kind);
v1::TrainingMethod::Kind ToProto(TrainingKind kind);

// UNSPECIFIED yields `if_unspecified` when given, else INVALID_ARGUMENT naming `field`.
// A value outside the enum (proto3 enums are open) is always INVALID_ARGUMENT.
absl::StatusOr<DType> DTypeFromProto(int value, absl::string_view field,
                                     std::optional<DType> if_unspecified = std::nullopt);
absl::StatusOr<BlockMode> BlockModeFromProto(int value, absl::string_view field);
absl::StatusOr<HostMemoryKind> HostMemoryKindFromProto(
    int value, absl::string_view field,
    std::optional<HostMemoryKind> if_unspecified = std::nullopt);
// KIND_UNSPECIFIED means a full fine-tune (documented in the proto).
absl::StatusOr<TrainingKind> TrainingKindFromProto(int value, absl::string_view field);

// ---------------------------------------------------------------- messages, domain -> proto
v1::ModelArch ToProto(const ModelSpec& spec);
v1::HardwareProfile ToProto(const HardwareSpec& spec);
v1::Workload ToProto(const Workload& workload);
v1::TrainingMethod ToProto(const TrainingMethod& method);
v1::BlockTrace ToProto(const BlockTrace& block);
v1::EdgeTrace ToProto(const EdgeTrace& edge);
v1::Trace ToProto(const Trace& trace);
v1::FixedKnobs ToProto(const FixedKnobs& knobs);
v1::ResidencyPlan ToProto(const ResidencyPlan& plan);
v1::MemoryBreakdown ToProto(const MemoryBreakdown& breakdown);
v1::Prediction ToProto(const Prediction& prediction);
v1::Measurement ToProto(const Measurement& measurement);
v1::Calibration ToProto(const Calibration& calibration);

// ---------------------------------------------------------------- messages, proto -> domain
// `prefix` names the message in errors, e.g. "request.fixed." (ends with a dot when non-empty).

// Zero-valued optional fields keep the domain defaults: empty family -> "llama", rope_theta 0 ->
// 500000, rms_norm_eps 0 -> 1e-5, max_position_embeddings 0 -> 131072.
ModelSpec ModelSpecFromProto(const v1::ModelArch& arch);
HardwareSpec HardwareSpecFromProto(const v1::HardwareProfile& profile);
// world_size and grad_accum 0 mean 1; micro_batch and seq_len are copied as sent.
Workload WorkloadFromProto(const v1::Workload& workload);
absl::StatusOr<TrainingMethod> TrainingMethodFromProto(const v1::TrainingMethod& method,
                                                       absl::string_view prefix);
BlockTrace BlockTraceFromProto(const v1::BlockTrace& block);
EdgeTrace EdgeTraceFromProto(const v1::EdgeTrace& edge);
// param_dtype is required.
absl::StatusOr<Trace> TraceFromProto(const v1::Trace& trace, absl::string_view prefix);
// proto3 `optional` presence becomes std::optional; host_memory, when present, must be specified.
absl::StatusOr<FixedKnobs> FixedKnobsFromProto(const v1::FixedKnobs& knobs,
                                               absl::string_view prefix);
// host_memory and every block mode are required; world_size 0 means 1.
absl::StatusOr<ResidencyPlan> ResidencyPlanFromProto(const v1::ResidencyPlan& plan,
                                                     absl::string_view prefix);
// fragmentation_factor 0 (unset) means 1.
MemoryBreakdown MemoryBreakdownFromProto(const v1::MemoryBreakdown& breakdown);
Prediction PredictionFromProto(const v1::Prediction& prediction);
Measurement MeasurementFromProto(const v1::Measurement& measurement);
// param_dtype is required.
absl::StatusOr<Calibration> CalibrationFromProto(const v1::Calibration& calibration,
                                                 absl::string_view prefix);

}  // namespace memplan
