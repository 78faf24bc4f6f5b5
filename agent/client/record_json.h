// JSON files for the agent's offline records: plan answers (`--plan-file`), profiled traces and
// hardware profiles. Written with the memplan.v1 field names in snake_case; traces and hardware
// profiles are valid proto JSON (`memplan trace submit` / `memplan hardware submit` read them),
// plan files are also read by ParsePlanJson (agent/train). Reading accepts snake_case or
// lowerCamelCase keys, 64-bit integers as numbers or strings, and enums by short ("bf16") or proto
// ("DTYPE_BF16") names, so `memplan --json plan` output is a plan file too. Errors are
// INVALID_ARGUMENT naming the field. Torch-free, protobuf-free; thread-safe (pure functions).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/client/plan_answer.h"
#include "common/types.h"

namespace memplan {

std::string PlanAnswerToJson(const PlanAnswer& answer);
absl::StatusOr<PlanAnswer> PlanAnswerFromJson(absl::string_view json);

std::string TraceToJson(const Trace& trace);
absl::StatusOr<Trace> TraceFromJson(absl::string_view json);

std::string HardwareSpecToJson(const HardwareSpec& hardware);
absl::StatusOr<HardwareSpec> HardwareSpecFromJson(absl::string_view json);

// Whole-file helpers. Writing goes through a temporary file renamed into place, so a reader never
// sees half a file.
absl::Status WriteTextFile(const std::string& path, absl::string_view contents);
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace memplan
