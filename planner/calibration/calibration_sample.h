// What the calibration is learned for and from: CalibrationKey (card, dtype, model family, method,
// optimizer) and CalibrationSample (one measured run). Value types, thread-compatible; the store keeps them, the
// calibrator (calibrator.h) fits them.
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"

namespace memplan {

// What a calibration is learned for. Value type, thread-compatible.
// [Calibration keys] The fitted factors depend on what allocates the dynamic memory and what the
// step spends its time on, so a key names the method ("full", "lora", "qlora") and the optimizer
// ("adamw", "adamw_bf16", "adamw8bit", "sgd") besides the card, dtype and family: a LoRA run's
// measurement never moves a full fine-tune's prediction. Every sample is also kept under the
// method's pooled key (optimizer kAnyOptimizer); a plan for a key with no samples of its own fits
// those (an optimizer of a measured method starts from what the method taught); the pooled key
// never holds a stored calibration. Keys with both fields empty hold the calibrations stored
// before keys carried them (methods and optimizers mixed); they answer only where neither of the
// others has samples.
struct CalibrationKey {
  std::string hardware_name;
  DType param_dtype = DType::kBFloat16;
  std::string model_family;
  std::string method = "full";
  std::string optimizer = "adamw";

  friend bool operator==(const CalibrationKey&, const CalibrationKey&) = default;
};

inline constexpr char kAnyOptimizer[] = "*";

// The pooled key of `key`'s method and the legacy key of its card, dtype and family.
inline CalibrationKey PooledCalibrationKey(CalibrationKey key) {
  key.optimizer = kAnyOptimizer;
  return key;
}
inline CalibrationKey LegacyCalibrationKey(CalibrationKey key) {
  key.method.clear();
  key.optimizer.clear();
  return key;
}

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
