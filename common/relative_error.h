// [Relative error] The one definition of a prediction's error used everywhere memplan reports
// one (the ReportMeasurement answer, the CLI, the agent's log, the calibrator, the
// memplan_prediction_relative_error histogram, the alert rules and the dashboards):
//
//   relative error = (predicted - measured) / measured
//
// Negative: the run used more than predicted (under-prediction, the side that runs out of
// memory); positive: memory was left unused. A run that ran out of memory has no measured peak
// (what it reached is a lower bound), so it has no relative error: OOM reports are counted apart.
#pragma once

#include <cstdint>
#include <optional>

namespace memplan {

// Written out for help texts and table captions.
inline constexpr char kRelativeErrorDefinition[] = "(predicted - measured) / measured";

// (predicted - measured) / measured; none when `measured_bytes` <= 0 (nothing was measured).
std::optional<double> RelativeError(int64_t predicted_bytes, int64_t measured_bytes);

}  // namespace memplan
