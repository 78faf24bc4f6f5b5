// What the calibration is learned for and from: CalibrationKey (card, dtype, model family) and
// CalibrationSample (one measured run). Value types, thread-compatible; the store keeps them, the
// calibrator (calibrator.h) fits them.
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"

namespace memplan {

// What a calibration is learned for. Value type, thread-compatible.
struct CalibrationKey {
  std::string hardware_name;
  DType param_dtype = DType::kBFloat16;
  std::string model_family;

  friend bool operator==(const CalibrationKey&, const CalibrationKey&) = default;
};

// One measured run, reduced to what the fit needs. raw_model_bytes is the cost model's peak
// before calibration and without the fixed part; exact_bytes the part of it allocated at its
// exact size (not scaled; 0 for samples stored before the split: all scaled); fixed_bytes is the
// CUDA context.
struct CalibrationSample {
  int64_t raw_model_bytes = 0;
  int64_t fixed_bytes = 0;
  int64_t measured_bytes = 0;  // measured steady peak (reserved)
  int64_t measured_at_unix_ms = 0;
  // The run ran out of memory: measured_bytes is only a lower bound on the true peak. Such a
  // sample is kept out of the central estimate but still must not be under-predicted.
  bool oom = false;
  // Step times: the cost model's own prediction (before any time factor) and the measurement;
  // 0 when unknown.
  double predicted_seconds = 0;
  double measured_seconds = 0;
  int64_t exact_bytes = 0;
};

}  // namespace memplan
