// Sanity checks a reported measurement passes before it may change calibration: its peaks fit
// the card the plan was made for, its step time is within a factor of the plan's prediction, and
// its client is not reporting in a burst. A measurement that fails one is stored quarantined
// (with the reason) and kept out of calibration; PlannerCore::ReportMeasurement applies them.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "memplan/v1/planner.pb.h"

namespace memplan {

struct MeasurementCheckOptions {
  // A step time outside [predicted / ratio, predicted x ratio] is quarantined. Calibrated
  // predictions were within 13 % of measured steps in every benchmarked run
  // (docs/benchmarks.md), so 3x is far outside anything a real run of the plan produces.
  double max_step_time_ratio = 3;
  // More reports than this from one client within burst_window_ms are quarantined; 0: no limit.
  // An agent reports once per training run.
  int burst_max_reports = 20;
  int64_t burst_window_ms = 60'000;
};

// Names of the checks: the `check` label of memplan_measurements_quarantined_total and the start
// of Measurement.quarantine_reason.
inline constexpr char kCheckPeakAboveCard[] = "peak_above_card";
inline constexpr char kCheckStepTimeOutOfBand[] = "step_time_out_of_band";
inline constexpr char kCheckBurst[] = "burst";

struct Quarantine {
  std::string check;   // one of the kCheck* names
  std::string reason;  // "check: what was wrong, with the numbers"
};

// The checks against the stored plan: any peak above `gpu_memory_bytes` (the card the plan was
// made for), or a step time outside the band around `predicted_iteration_seconds` (skipped when
// either is 0, e.g. an OOM report).
std::optional<Quarantine> CheckAgainstPlan(const v1::Measurement& m, int64_t gpu_memory_bytes,
                                           double predicted_iteration_seconds,
                                           const MeasurementCheckOptions& options);

// Counts reports per client over a sliding window. Thread-compatible (PlannerCore holds its
// lock); memory stays bounded by forgetting clients whose window is empty.
class BurstLimiter {
 public:
  explicit BurstLimiter(const MeasurementCheckOptions& options);

  // Records one report of `client` at `now_ms`; a Quarantine when it is beyond the limit.
  // Every report counts, quarantined or not, so a flood stays quarantined while it lasts.
  std::optional<Quarantine> Record(const std::string& client, int64_t now_ms);

 private:
  const int max_reports_;
  const int64_t window_ms_;
  std::map<std::string, std::deque<int64_t>> recent_;
};

}  // namespace memplan
