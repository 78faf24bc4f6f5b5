// Human-readable renderings of the planner's replies for the `memplan` CLI (the --json form is
// proto JSON and lives in the runner). Pure functions of the messages; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"
#include "google/protobuf/repeated_field.h"
#include "memplan/v1/planner.pb.h"

namespace memplan::cli {

// "ckpt×12 none×20": runs of equal consecutive block modes, in block order.
std::string CompressBlockModes(const google::protobuf::RepeatedField<int>& modes);
// "71.23 GiB" (two decimals).
std::string FormatGiB(int64_t bytes);
// "850 ms" below one second, else "1.234 s".
std::string FormatSeconds(double seconds);
// "12,345" (rounded to an integer, thousands separated).
std::string FormatCount(double value);
// "chunk 64 MiB × 40, persist 12, buffer 2, swap 0, ckpt 12, hs_offload 0, host pinned"
std::string FormatKnobs(const v1::ResidencyPlan& plan);

// The full answer to `memplan plan`: verdict, knobs, blocks, breakdown, predictions, limits and
// the alternatives table.
std::string FormatPlanResponse(const v1::PlanResponse& response);
// A vision-language plan's vision tower: its images, weights, what it keeps and its transients
// ([Vision tower price], common/vision_cost.h) and their share of the predicted peak; empty for
// a model without a tower or a workload without images.
std::string FormatVisionTower(const ModelSpec& model, const Workload& workload, DType dtype,
                              bool trains, const v1::PlanResponse& response);
std::string FormatPresets(const v1::ListPresetsResponse& presets, bool models, bool hardware);
std::string FormatHardwareProfile(const v1::HardwareProfile& profile);
std::string FormatTrace(const v1::Trace& trace);
std::string FormatCalibrations(const v1::GetCalibrationResponse& response);
std::string FormatMeasurementReply(const v1::ReportMeasurementResponse& reply);
// One row per pool (verdict, peak, tokens/s per GPU and for the job, plan id), the best pool
// and each pool's reason.
std::string FormatAdmit(const v1::AdmitResponse& reply);
// A page of stored plans as one table (one row per plan).
std::string FormatPlansList(const v1::ListPlansResponse& page);
// A stored plan: what was asked, the answer, and the measurements reported for it.
std::string FormatStoredPlan(const v1::StoredPlan& plan);

}  // namespace memplan::cli
