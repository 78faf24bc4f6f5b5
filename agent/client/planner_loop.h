// The planner loop of one training run, the agent's side: profile the model and submit its trace
// (--profile), ask for a plan and print it, report the measured run back. Each step prints the
// lines `memplan-agent train` is read by (scripts and tests parse them). Torch-free header: the
// model options are only forward-declared, and the client is reached through its plain structs.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/client/plan_answer.h"
#include "agent/client/planner_flags.h"
#include "common/types.h"

namespace memplan {

class PlannerClient;       // agent/client/planner_client.h
struct LlamaModelOptions;  // agent/model/llama_model.h

// "chunk_bytes=... n_chunks=... block_modes=..." : the `plan:` line of a run.
std::string PlanLine(const ResidencyPlan& plan);

// Profiles a throw-away copy of the model built from `model_options` (every parameter on the
// device, or on demand when they would not fit) at the micro-batch, sequence length, gradient
// accumulation and clipping of `workload`, and stores the trace in the planner; returns its id.
// RESOURCE_EXHAUSTED when even the on-demand profile does not fit the device.
absl::StatusOr<std::string> ProfileAndSubmit(PlannerClient& client,
                                             const LlamaModelOptions& model_options,
                                             const Workload& workload,
                                             const std::string& hardware_name);

// Asks the planner for a plan. `query` names the model (arch_preset or arch), the workload and
// the training method; the hardware and the safety margin come from `loop`. With loop.profile
// the model is profiled first (ProfileAndSubmit) and its trace replaces the model source, unless
// the profile does not fit the device. FAILED_PRECONDITION when no plan fits.
absl::StatusOr<PlanAnswer> AskPlanner(PlannerClient& client, const PlannerLoopOptions& loop,
                                      PlanQuery query, const LlamaModelOptions& model_options);

// Prints predicted against measured and reports `m` for `answer`'s plan. A measurement without a
// device peak (a CPU run) is not sent: the planner refuses peak_reserved_bytes < 1, and a zero
// would poison its calibration.
absl::Status ReportToPlanner(PlannerClient& client, const PlanAnswer& answer, Measurement m);

}  // namespace memplan
