// Fits the per-(hardware, dtype, model family) fragmentation factor and residual from measured
// peaks. Pure: no I/O, no clock. Contract with the cost model (see README.md):
//   predicted_peak_bytes = exact_bytes + ceil(fragmentation_factor * (raw_model_bytes -
//   exact_bytes)) + residual_bytes + fixed_bytes
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "planner/calibration/calibration_sample.h"

namespace memplan {

struct CalibratorOptions {
  double min_fragmentation_factor = 0.5;
  double max_fragmentation_factor = 2.0;
  // How far above the robust estimate (relative) the factor may be raised to keep the window
  // from being under-predicted; whatever is left goes into the residual.
  double max_factor_raise = 0.10;
  // Only the newest window_samples samples (by measured_at_unix_ms) are used; <= 0: all.
  int window_samples = 20;
  // The residual never exceeds this fraction of the window's median measured bytes.
  double max_residual_fraction = 0.05;
  double min_time_factor = 0.25;
  double max_time_factor = 4.0;
};

struct CalibrationResult {
  double fragmentation_factor = 1.0;  // to apply: the estimate, possibly raised
  // The robust estimate alone (clamped median ratio): what converges to the true factor.
  double estimated_fragmentation_factor = 1.0;
  int64_t residual_bytes = 0;
  int32_t samples = 0;  // samples used (valid ones inside the window)
  // Mean |predicted - measured| / measured of the uncalibrated model (factor 1, residual 0)
  // over the non-OOM samples used.
  double mean_abs_relative_error = 0;
  // The same error after calibration (what the fit achieved on its own window).
  double calibrated_mean_abs_relative_error = 0;
  // OOM samples still above their calibrated prediction because the residual hit its cap: the
  // cost model is wrong for them, calibration does not paper over it.
  int32_t uncovered_samples = 0;
  // Step time: median of measured / predicted over non-OOM samples with both times, clamped to
  // [min_time_factor, max_time_factor]; 0 (and time_samples 0) when there is none.
  double time_factor = 0;
  int32_t time_samples = 0;
};

// Robust, bounded fit (README.md): the factor is the median of
// (measured - fixed - exact) / (raw - exact) over non-OOM samples, clamped to the bounds (the
// central estimate of the measured runs); when the window holds OOM samples it is raised by at
// most max_factor_raise and the residual (>= 0, at most max_residual_fraction of the median
// measurement) set so that no OOM sample is under-predicted where that cap allows, choosing the
// split with the least mean over-prediction. With no usable sample: factor 1, residual 0.
CalibrationResult FitCalibration(const std::vector<CalibrationSample>& recent,
                                 const CalibratorOptions& options);

// The calibrated prediction of the contract above.
int64_t CalibratedPeakBytes(double fragmentation_factor, int64_t residual_bytes,
                            int64_t raw_model_bytes, int64_t fixed_bytes, int64_t exact_bytes = 0);
int64_t CalibratedPeakBytes(double fragmentation_factor, int64_t residual_bytes,
                            const CalibrationSample& sample);

}  // namespace memplan
