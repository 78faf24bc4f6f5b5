#include "planner/service/measurement_checks.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memplan {
namespace {

// Beyond this many tracked clients, those with an empty window are forgotten.
constexpr size_t kMaxTrackedClients = 4096;

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

}  // namespace

std::optional<Quarantine> CheckAgainstPlan(const v1::Measurement& m, int64_t gpu_memory_bytes,
                                           double predicted_iteration_seconds,
                                           const MeasurementCheckOptions& options) {
  if (gpu_memory_bytes > 0) {
    for (const auto& [field, bytes] : std::initializer_list<std::pair<const char*, int64_t>>{
             {"peak_reserved_bytes", m.peak_reserved_bytes()},
             {"peak_allocated_bytes", m.peak_allocated_bytes()},
             {"peak_device_bytes", m.peak_device_bytes()},
             {"load_peak_bytes", m.load_peak_bytes()}}) {
      if (bytes > gpu_memory_bytes) {
        return Quarantine{kCheckPeakAboveCard,
                          absl::StrCat(kCheckPeakAboveCard, ": ", field, " = ", bytes, " (",
                                       GiB(bytes), ") is above the card's ", gpu_memory_bytes,
                                       " bytes (", GiB(gpu_memory_bytes), ")")};
      }
    }
  }
  const double step = m.step_seconds();
  const double ratio = options.max_step_time_ratio;
  if (step > 0 && predicted_iteration_seconds > 0 && ratio > 0) {
    const double low = predicted_iteration_seconds / ratio;
    const double high = predicted_iteration_seconds * ratio;
    if (step < low || step > high) {
      return Quarantine{
          kCheckStepTimeOutOfBand,
          absl::StrFormat("%s: step_seconds = %.6g is outside [%.6g, %.6g], %gx around the "
                          "plan's predicted %.6g s",
                          kCheckStepTimeOutOfBand, step, low, high, ratio,
                          predicted_iteration_seconds)};
    }
  }
  return std::nullopt;
}

BurstLimiter::BurstLimiter(const MeasurementCheckOptions& options)
    : max_reports_(options.burst_max_reports), window_ms_(options.burst_window_ms) {}

std::optional<Quarantine> BurstLimiter::Record(const std::string& client, int64_t now_ms) {
  if (max_reports_ <= 0) return std::nullopt;
  const int64_t since = now_ms - window_ms_;
  if (recent_.size() >= kMaxTrackedClients) {
    std::erase_if(recent_, [since](const auto& entry) { return entry.second.back() <= since; });
  }
  std::deque<int64_t>& times = recent_[client];
  while (!times.empty() && times.front() <= since) times.pop_front();
  times.push_back(now_ms);
  if (static_cast<int>(times.size()) <= max_reports_) return std::nullopt;
  return Quarantine{
      kCheckBurst,
      absl::StrCat(kCheckBurst, ": ", times.size(), " reports from ", client, " within ",
                   window_ms_ / 1000.0, " s; at most ", max_reports_, " are used for calibration")};
}

}  // namespace memplan
