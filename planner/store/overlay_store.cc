#include "planner/store/overlay_store.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace memplan {
namespace {

class OverlayStore final : public Store {
 public:
  OverlayStore(std::unique_ptr<Store> base, std::unique_ptr<Store> overlay)
      : base_(std::move(base)), overlay_(std::move(overlay)) {}

  absl::StatusOr<std::string> PutTrace(const v1::Trace& trace) override {
    return overlay_->PutTrace(trace);
  }
  absl::StatusOr<v1::Trace> GetTrace(absl::string_view trace_id) override {
    return FirstFound(overlay_->GetTrace(trace_id), [&] { return base_->GetTrace(trace_id); });
  }
  absl::StatusOr<std::optional<v1::Trace>> FindTrace(const v1::Trace& key) override {
    return FirstSome(overlay_->FindTrace(key), [&] { return base_->FindTrace(key); });
  }

  absl::StatusOr<std::string> PutHardwareProfile(const v1::HardwareProfile& p) override {
    return overlay_->PutHardwareProfile(p);
  }
  absl::StatusOr<v1::HardwareProfile> GetHardwareProfile(absl::string_view profile_id) override {
    return FirstFound(overlay_->GetHardwareProfile(profile_id),
                      [&] { return base_->GetHardwareProfile(profile_id); });
  }
  absl::StatusOr<std::optional<v1::HardwareProfile>> FindHardwareProfileByName(
      absl::string_view name) override {
    return FirstSome(overlay_->FindHardwareProfileByName(name),
                     [&] { return base_->FindHardwareProfileByName(name); });
  }

  absl::StatusOr<std::string> PutPlan(const v1::StoredPlan& plan) override {
    return overlay_->PutPlan(plan);
  }
  absl::StatusOr<v1::StoredPlan> GetPlan(absl::string_view plan_id) override {
    return FirstFound(overlay_->GetPlan(plan_id), [&] { return base_->GetPlan(plan_id); });
  }
  absl::StatusOr<ListPlansPage> ListPlans(int page_size, absl::string_view page_token) override {
    return overlay_->ListPlans(page_size, page_token);
  }

  absl::StatusOr<std::string> PutMeasurement(const v1::Measurement& m) override {
    return overlay_->PutMeasurement(m);
  }
  absl::StatusOr<std::vector<std::string>> PutMeasurements(
      absl::Span<const v1::Measurement> measurements) override {
    return overlay_->PutMeasurements(measurements);
  }
  absl::StatusOr<int64_t> CountMeasurements() override {
    ASSIGN_OR_RETURN(const int64_t base, base_->CountMeasurements());
    ASSIGN_OR_RETURN(const int64_t overlay, overlay_->CountMeasurements());
    return base + overlay;
  }

  absl::StatusOr<std::vector<CalibrationSample>> RecentCalibrationSamples(const CalibrationKey& key,
                                                                          int limit) override {
    ASSIGN_OR_RETURN(std::vector<CalibrationSample> overlay,
                     overlay_->RecentCalibrationSamples(key, limit));
    if (!overlay.empty()) return overlay;
    return base_->RecentCalibrationSamples(key, limit);
  }
  absl::Status PutCalibrationSample(const CalibrationKey& key,
                                    const CalibrationSample& sample) override {
    return overlay_->PutCalibrationSample(key, sample);
  }
  absl::Status PutCalibration(const v1::Calibration& c) override {
    return overlay_->PutCalibration(c);
  }
  absl::StatusOr<std::optional<v1::Calibration>> GetCalibration(
      const CalibrationKey& key) override {
    return FirstSome(overlay_->GetCalibration(key), [&] { return base_->GetCalibration(key); });
  }
  absl::StatusOr<std::vector<v1::Calibration>> ListCalibrations(
      const CalibrationFilter& filter) override {
    ASSIGN_OR_RETURN(std::vector<v1::Calibration> base, base_->ListCalibrations(filter));
    ASSIGN_OR_RETURN(std::vector<v1::Calibration> overlay, overlay_->ListCalibrations(filter));
    // Keyed by the calibration's identity minus its figures: the message with them cleared.
    std::map<std::string, v1::Calibration> merged;
    for (std::vector<v1::Calibration>* list : {&base, &overlay}) {
      for (v1::Calibration& c : *list) merged[IdentityOf(c)] = std::move(c);
    }
    std::vector<v1::Calibration> out;
    out.reserve(merged.size());
    for (auto& [key, c] : merged) out.push_back(std::move(c));
    return out;
  }

  absl::Status CheckIntegrity(IntegrityCheck mode) override { return base_->CheckIntegrity(mode); }
  StoreCounters Counters() const override { return base_->Counters(); }

 private:
  // What names a calibration: the message without its fitted figures, behind the fields
  // ListCalibrations orders by.
  static std::string IdentityOf(const v1::Calibration& c) {
    v1::Calibration key = c;
    key.clear_fragmentation_factor();
    key.clear_residual_bytes();
    key.clear_samples();
    key.clear_mean_abs_relative_error();
    key.clear_updated_at_unix_ms();
    key.clear_time_factor();
    key.clear_time_samples();
    std::string bytes;
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    key.SerializeToCodedStream(&coded);
    coded.Trim();
    return absl::StrCat(c.hardware_name(), std::string(1, '\0'), c.param_dtype(),
                        std::string(1, '\0'), c.model_family(), std::string(1, '\0'), bytes);
  }

  template <typename T, typename Fallback>
  static absl::StatusOr<T> FirstFound(absl::StatusOr<T> first, Fallback fallback) {
    if (absl::IsNotFound(first.status())) return fallback();
    return first;
  }
  template <typename T, typename Fallback>
  static absl::StatusOr<std::optional<T>> FirstSome(absl::StatusOr<std::optional<T>> first,
                                                    Fallback fallback) {
    if (first.ok() && !first->has_value()) return fallback();
    return first;
  }

  const std::unique_ptr<Store> base_;
  const std::unique_ptr<Store> overlay_;
};

}  // namespace

std::unique_ptr<Store> NewOverlayStore(std::unique_ptr<Store> base,
                                       std::unique_ptr<Store> overlay) {
  return std::make_unique<OverlayStore>(std::move(base), std::move(overlay));
}

}  // namespace memplan
