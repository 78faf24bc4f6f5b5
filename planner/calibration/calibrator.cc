#include "planner/calibration/calibrator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/relative_error.h"

namespace memplan {
namespace {

double Median(std::vector<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return 0.5 * (lower + upper);
}

double MeanAbsRelativeError(const std::vector<CalibrationSample>& samples, double factor,
                            int64_t residual_bytes) {
  double sum = 0;
  int count = 0;
  for (const CalibrationSample& s : samples) {
    if (s.oom) continue;  // an OOM peak is a lower bound, not a value to compare against
    sum += std::abs(
        RelativeError(CalibratedPeakBytes(factor, residual_bytes, s), s.measured_bytes)
            .value_or(0));
    ++count;
  }
  return count == 0 ? 0.0 : sum / count;
}

// Smallest residual (>= 0) for which no OOM sample is above its prediction: a plan that ran out
// of memory must not be predicted to fit again. Measured runs are not covered: the factor is their
// central estimate, and the spread around it is what the request's safety margin is for.
// Floored at 0 so a factor clamped from below never pulls predictions down further.
int64_t MinimalResidual(const std::vector<CalibrationSample>& samples, double factor) {
  int64_t residual = 0;
  for (const CalibrationSample& s : samples) {
    if (!s.oom) continue;
    residual =
        std::max(residual, s.measured_bytes -
                               CalibratedPeakBytes(factor, 0, s));
  }
  return residual;
}

double MeanRelativeOverPrediction(const std::vector<CalibrationSample>& samples, double factor,
                                  int64_t residual_bytes) {
  double sum = 0;
  int count = 0;
  for (const CalibrationSample& s : samples) {
    if (s.oom) continue;
    sum += RelativeError(CalibratedPeakBytes(factor, residual_bytes, s), s.measured_bytes)
               .value_or(0);
    ++count;
  }
  return count == 0 ? 0.0 : sum / count;
}

}  // namespace

int64_t CalibratedPeakBytes(double fragmentation_factor, int64_t residual_bytes,
                            int64_t raw_model_bytes, int64_t fixed_bytes, int64_t exact_bytes) {
  const double scaled =
      std::ceil(fragmentation_factor * static_cast<double>(raw_model_bytes - exact_bytes));
  return exact_bytes + static_cast<int64_t>(scaled) + residual_bytes + fixed_bytes;
}

int64_t CalibratedPeakBytes(double fragmentation_factor, int64_t residual_bytes,
                            const CalibrationSample& s) {
  return CalibratedPeakBytes(fragmentation_factor, residual_bytes, s.raw_model_bytes,
                             s.fixed_bytes, s.exact_bytes);
}

CalibrationResult FitCalibration(const std::vector<CalibrationSample>& recent,
                                 const CalibratorOptions& options) {
  std::vector<CalibrationSample> window;
  window.reserve(recent.size());
  for (const CalibrationSample& s : recent) {
    // A sample without a scaled part or a measurement says nothing about the factor.
    if (s.raw_model_bytes > s.exact_bytes && s.exact_bytes >= 0 && s.measured_bytes > 0 &&
        s.fixed_bytes >= 0) {
      window.push_back(s);
    }
  }
  // Callers usually pass newest first already; sorting makes the window independent of that.
  std::stable_sort(window.begin(), window.end(),
                   [](const CalibrationSample& a, const CalibrationSample& b) {
                     return a.measured_at_unix_ms > b.measured_at_unix_ms;
                   });
  if (options.window_samples > 0 && window.size() > static_cast<size_t>(options.window_samples)) {
    window.resize(options.window_samples);
  }

  CalibrationResult result;
  result.samples = static_cast<int32_t>(window.size());
  if (window.empty()) return result;

  // The median ratio ignores up to half the window being outliers; OOM samples only bound the
  // peak from below, so they do not vote (they are honoured by the no-under-estimate step).
  std::vector<double> ratios;
  for (const CalibrationSample& s : window) {
    if (s.oom) continue;
    ratios.push_back(static_cast<double>(s.measured_bytes - s.fixed_bytes - s.exact_bytes) /
                     static_cast<double>(s.raw_model_bytes - s.exact_bytes));
  }
  double factor = ratios.empty() ? 1.0 : Median(std::move(ratios));
  factor = std::clamp(factor, options.min_fragmentation_factor, options.max_fragmentation_factor);

  // The guarantee (no OOM sample in the window above its prediction) is met by raising the
  // factor a bounded amount above the robust estimate and covering the rest with the residual.
  // The raise is chosen to minimise the mean relative over-prediction of the measured runs: a
  // purely additive residual would carry one run's shortfall, in bytes, onto the smallest runs.
  const double low = factor;
  const double high = std::min(options.max_fragmentation_factor,
                               low * (1.0 + std::max(0.0, options.max_factor_raise)));
  auto over_prediction = [&window](double f) {
    return MeanRelativeOverPrediction(window, f, MinimalResidual(window, f));
  };
  // The objective is convex in the factor (a sum of linear terms plus a positive multiple of
  // the convex residual), so a golden-section search finds its minimum on [low, high].
  constexpr double kInvPhi = 0.6180339887498949;
  double a = low, b = high;
  for (int i = 0; i < 64 && b - a > 1e-9; ++i) {
    const double c = b - kInvPhi * (b - a);
    const double d = a + kInvPhi * (b - a);
    if (over_prediction(c) <= over_prediction(d)) {
      b = d;
    } else {
      a = c;
    }
  }
  // Ties (including "no non-OOM samples") keep the unraised factor.
  if (over_prediction(a) < over_prediction(low)) factor = a;
  int64_t residual = MinimalResidual(window, factor);
  // The residual covers an OOM's shortfall of a few percent, not a cost-model error: one OOM
  // that needs more (a plan the model got structurally wrong) must not inflate every later
  // prediction of the family. Capped at a fraction of the window's median measurement; OOM
  // samples still above their prediction are counted so the error stays visible.
  std::vector<double> measured;
  for (const CalibrationSample& s : window) {
    measured.push_back(static_cast<double>(s.measured_bytes));
  }
  const double cap = std::max(0.0, options.max_residual_fraction) * Median(std::move(measured));
  if (static_cast<double>(residual) > cap) residual = static_cast<int64_t>(cap);
  for (const CalibrationSample& s : window) {
    if (s.oom && CalibratedPeakBytes(factor, residual, s) < s.measured_bytes) {
      ++result.uncovered_samples;
    }
  }

  std::vector<double> time_ratios;
  for (const CalibrationSample& s : window) {
    if (s.oom || !(s.predicted_seconds > 0) || !(s.measured_seconds > 0)) continue;
    time_ratios.push_back(s.measured_seconds / s.predicted_seconds);
  }
  result.time_samples = static_cast<int32_t>(time_ratios.size());
  if (!time_ratios.empty()) {
    result.time_factor = std::clamp(Median(std::move(time_ratios)), options.min_time_factor,
                                    options.max_time_factor);
  }

  result.fragmentation_factor = factor;
  result.estimated_fragmentation_factor = low;
  result.residual_bytes = residual;
  result.mean_abs_relative_error = MeanAbsRelativeError(window, 1.0, 0);
  result.calibrated_mean_abs_relative_error = MeanAbsRelativeError(window, factor, residual);
  return result;
}

}  // namespace memplan
