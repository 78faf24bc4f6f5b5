// JSON files for the agent's offline records: plan answers (`--plan-file`), profiled traces and
// hardware profiles. Written with the memplan.v1 field names in snake_case; traces and hardware
// profiles are valid proto JSON (`memplan trace submit` / `memplan hardware submit` read them).
// Plan files have one reader, PlanFileFromJson: PlanAnswerFromJson and agent/train's run checks
// (ParsePlanJson, RunnablePlan) both go through it. Reading accepts snake_case or lowerCamelCase
// keys, 64-bit integers as numbers or strings, and enums by short ("bf16") or proto ("DTYPE_BF16")
// names (plan enums also by proto number), so `memplan --json plan` output is a plan file too.
// Errors are INVALID_ARGUMENT naming the field by its path. Torch-free, protobuf-free; thread-safe
// (pure functions).
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/client/plan_answer.h"
#include "common/types.h"

namespace memplan {

// A plan file as written: a bare ResidencyPlan, or an object holding one under "plan", at any
// depth (a PlanResponse, `{"plan": <PlanResponse>}`, ...). Plan counts outside [0, 2^20] and
// chunk_bytes outside [0, 2^44] are refused; whether a run may apply the plan is agent/train's
// RunnablePlan.
struct PlanFile {
  // The innermost holder's fields (verdict, prediction, alternatives, ids), `answer.plan` the plan.
  // A bare plan leaves everything but `answer.plan` at its default.
  PlanAnswer answer;
  bool bare = false;  // the document is the plan itself (no "plan" key)
  // Set when a holder on the way in says "fits": false (the outermost such): its reason, "" when
  // it gives none. Its plan is the least-bad one, shown for information.
  std::optional<std::string> does_not_fit_reason;
  // What the plan was made for: "optimizer" and "training" ({"kind", "lora_rank",
  // "lora_target_modules"}) next to the plan at any level of the "plan" descent, or in a "request"
  // object there (a stored plan's PlanRequest); the outermost wins. nullopt when the file names
  // none (PlanResponse JSON does not).
  std::optional<OptimizerKind> optimizer;
  std::optional<TrainingMethod> training;
};

absl::StatusOr<PlanFile> PlanFileFromJson(absl::string_view json);

// A plan file that holds its plan under "plan" ("plan is missing" for a bare plan): the answer.
std::string PlanAnswerToJson(const PlanAnswer& answer);
absl::StatusOr<PlanAnswer> PlanAnswerFromJson(absl::string_view json);

std::string TraceToJson(const Trace& trace);
absl::StatusOr<Trace> TraceFromJson(absl::string_view json);

std::string HardwareSpecToJson(const HardwareSpec& hardware);
absl::StatusOr<HardwareSpec> HardwareSpecFromJson(absl::string_view json);

// Enum spellings shared by these files and the agent's flags: the short name ("ckpt",
// "hs_offload", "pinned") or the proto name ("BLOCK_MODE_CKPT", "HOST_MEMORY_PINNED"), in any
// case, '-' for '_', surrounding blanks ignored; "checkpoint" is ckpt.
std::optional<BlockMode> ParseBlockModeName(absl::string_view name);
std::optional<HostMemoryKind> ParseHostMemoryName(absl::string_view name);

// Whole-file helpers. Writing goes through a temporary file renamed into place, so a reader never
// sees half a file.
absl::Status WriteTextFile(const std::string& path, absl::string_view contents);
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace memplan
