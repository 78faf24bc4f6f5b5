// PlannerCore's measurement path: reports stored and counted (OOM apart), peaks and step times
// recalibrating later predictions, and the checks that quarantine implausible reports. Split from
// planner_core_test.cc (the same fixture, planner_core_fixture.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/proto_convert.h"
#include "planner/core/plan_engine.h"
#include "planner/metrics/planner_metrics.h"
#include "planner/service/planner_core.h"
#include "planner/store/store.h"
#include "prometheus/registry.h"
#include "tests/planner/service/planner_core_fixture.h"

namespace memplan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---------------------------------------------------------------- measurements and calibration

// The series of `name` in the core's registry, as a count or sum: the number of series, the
// counters' total and the histograms' sample count.
struct RegistryTotals {
  int series = 0;
  double counter = 0;
  uint64_t samples = 0;
};
RegistryTotals Totals(prometheus::Registry& registry, const std::string& name) {
  RegistryTotals totals;
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      ++totals.series;
      totals.counter += metric.counter.value;
      totals.samples += metric.histogram.sample_count;
    }
  }
  return totals;
}

// An OOM run has no measured peak: the answer carries no relative error, and the metrics count it
// apart instead of observing an error of -1 (or +inf) and a measured peak of 0.
TEST_F(PlannerCoreTest, OomReportIsCountedApartWithNoRelativeError) {
  auto plan = Plan(TinyRequest());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t reserved =
      plan->prediction().peak_bytes() - plan->prediction().breakdown().cuda_context_bytes();
  for (const int64_t reached : {int64_t{0}, reserved + reserved / 4}) {
    v1::ReportMeasurementRequest report;
    report.mutable_measurement()->set_plan_id(plan->plan_id());
    report.mutable_measurement()->set_oom(true);
    report.mutable_measurement()->set_peak_reserved_bytes(reached);
    auto reported = core_->ReportMeasurement(report);
    ASSERT_TRUE(reported.ok()) << reported.status();
    EXPECT_EQ(reported->quarantine_reason(), "");
    EXPECT_FALSE(reported->has_relative_error()) << reached;
  }
  const RegistryTotals oom = Totals(*registry_, "memplan_measurements_oom_total");
  EXPECT_EQ(oom.series, 1);
  EXPECT_EQ(oom.counter, 2);
  EXPECT_EQ(Totals(*registry_, "memplan_prediction_relative_error").samples, 0u);
  EXPECT_EQ(Totals(*registry_, "memplan_plan_measured_peak_bytes").series, 0);
  EXPECT_EQ(Totals(*registry_, "memplan_last_oom_timestamp_seconds").series, 1);

  // A measured run of the same plan is observed as usual, with the error's sign of
  // common/relative_error.h: it used more than predicted, so negative.
  v1::ReportMeasurementRequest measured;
  measured.mutable_measurement()->set_plan_id(plan->plan_id());
  measured.mutable_measurement()->set_peak_reserved_bytes(reserved + reserved / 10);
  auto reported = core_->ReportMeasurement(measured);
  ASSERT_TRUE(reported.ok()) << reported.status();
  ASSERT_TRUE(reported->has_relative_error());
  EXPECT_NEAR(reported->relative_error(), -1.0 / 11.0, 1e-6);
  EXPECT_EQ(Totals(*registry_, "memplan_prediction_relative_error").samples, 1u);
  EXPECT_EQ(Totals(*registry_, "memplan_measurements_oom_total").counter, 2);
}

TEST_F(PlannerCoreTest, MeasurementIsStoredAndRecalibratesLaterPredictions) {
  auto first = Plan(TinyRequest());
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t predicted = first->prediction().peak_bytes();
  // The default before any measurement.
  EXPECT_EQ(first->prediction().breakdown().fragmentation_factor(), kDefaultFragmentationFactor);

  // The run used 5% more than predicted (within what the dynamic terms, scaled by at most
  // max_fragmentation_factor, can cover: the tiny model's activations are a small share of its
  // peak since [Fused norm] and [Fused gate]; 10% needed a factor above that cap).
  const int64_t measured = predicted + predicted / 20;
  v1::ReportMeasurementRequest report;
  report.mutable_measurement()->set_plan_id(first->plan_id());
  report.mutable_measurement()->set_peak_reserved_bytes(measured);
  report.mutable_measurement()->set_peak_allocated_bytes(measured - 1000);
  // A step time near the prediction (one far from it would be quarantined).
  report.mutable_measurement()->set_step_seconds(1.1 * first->prediction().iteration_seconds());
  auto reported = core_->ReportMeasurement(report);
  ASSERT_TRUE(reported.ok()) << reported.status();
  EXPECT_THAT(reported->measurement_id(), StartsWith("meas-"));
  EXPECT_EQ(reported->quarantine_reason(), "");
  // Errors compare reserved bytes: the prediction without the CUDA context it includes.
  const int64_t context = first->prediction().breakdown().cuda_context_bytes();
  ASSERT_GT(context, 0);
  EXPECT_NEAR(reported->relative_error(),
              static_cast<double>(predicted - context - measured) / static_cast<double>(measured),
              1e-12);
  EXPECT_EQ(reported->calibration().hardware_name(), "rtx-3090");
  EXPECT_EQ(reported->calibration().model_family(), "llama");
  EXPECT_EQ(reported->calibration().param_dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(reported->calibration().samples(), 1);
  EXPECT_GT(reported->calibration().updated_at_unix_ms(), 0);

  // Stored with the plan.
  v1::GetPlanRequest get;
  get.set_plan_id(first->plan_id());
  auto stored = core_->GetPlan(get);
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->plan().measurements_size(), 1);
  EXPECT_EQ(stored->plan().measurements(0).peak_reserved_bytes(), measured);
  EXPECT_GT(stored->plan().measurements(0).measured_at_unix_ms(), 0);

  // And visible through GetCalibration (filtered and unfiltered).
  v1::GetCalibrationRequest cal;
  cal.set_hardware_name("rtx-3090");
  auto calibrations = core_->GetCalibration(cal);
  ASSERT_TRUE(calibrations.ok());
  ASSERT_EQ(calibrations->calibrations_size(), 1);
  EXPECT_EQ(calibrations->calibrations(0).method(), "full");  // [Calibration keys]
  EXPECT_EQ(calibrations->calibrations(0).optimizer(), "adamw");
  cal.set_hardware_name("h200");
  EXPECT_EQ(core_->GetCalibration(cal)->calibrations_size(), 0);

  // The same plan again: pin every knob so only the calibration can change the peak.
  v1::PlanRequest again = TinyRequest();
  v1::FixedKnobs* fixed = again.mutable_fixed();
  fixed->set_chunk_bytes(first->plan().chunk_bytes());
  fixed->set_n_persist(first->plan().n_persist());
  fixed->set_n_buffer(first->plan().n_buffer());
  fixed->set_n_swap(first->plan().n_swap());
  fixed->set_n_checkpoint(first->plan().n_checkpoint());
  fixed->set_n_hs_offload(first->plan().n_hs_offload());
  fixed->set_host_memory(first->plan().host_memory());
  auto second = Plan(again);
  ASSERT_TRUE(second.ok()) << second.status();
  const v1::MemoryBreakdown& b = second->prediction().breakdown();
  EXPECT_EQ(b.fragmentation_factor(), reported->calibration().fragmentation_factor());
  EXPECT_EQ(b.calibration_residual_bytes(), reported->calibration().residual_bytes());
  EXPECT_GT(second->prediction().peak_bytes(), predicted);
  // Within the residual cap, the calibrator never lets a correction under-predict a measurement.
  EXPECT_GE(second->prediction().peak_bytes(), measured);
  // The raw model is unchanged: calibration acts only through alpha and the residual.
  EXPECT_EQ(RawModelBytes(PredictionFromProto(second->prediction())),
            RawModelBytes(PredictionFromProto(first->prediction())));
}

TEST_F(PlannerCoreTest, MeasuredStepTimesCalibrateLaterTimePredictions) {
  auto first = Plan(TinyRequest());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->prediction().time_factor(), 1.0);
  const double predicted = first->prediction().iteration_seconds();
  ASSERT_GT(predicted, 0);
  // The step took 1.25 times the prediction.
  v1::ReportMeasurementRequest report;
  report.mutable_measurement()->set_plan_id(first->plan_id());
  report.mutable_measurement()->set_peak_reserved_bytes(first->prediction().peak_bytes());
  report.mutable_measurement()->set_step_seconds(1.25 * predicted);
  auto reported = core_->ReportMeasurement(report);
  ASSERT_TRUE(reported.ok()) << reported.status();
  EXPECT_EQ(reported->calibration().time_samples(), 1);
  EXPECT_NEAR(reported->calibration().time_factor(), 1.25, 1e-9);

  auto second = Plan(TinyRequest());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NEAR(second->prediction().time_factor(), 1.25, 1e-9);
  if (second->plan().n_persist() == first->plan().n_persist() &&
      second->plan().n_buffer() == first->plan().n_buffer()) {
    EXPECT_NEAR(second->prediction().iteration_seconds(), 1.25 * predicted, 1e-9 * predicted);
  }
  EXPECT_NEAR(second->prediction().tokens_per_second() * second->prediction().iteration_seconds(),
              first->prediction().tokens_per_second() * predicted, 1e-6);

  // A second report against the calibrated plan uses its uncalibrated time: the factor stays.
  v1::ReportMeasurementRequest again;
  again.mutable_measurement()->set_plan_id(second->plan_id());
  again.mutable_measurement()->set_peak_reserved_bytes(second->prediction().peak_bytes());
  again.mutable_measurement()->set_step_seconds(second->prediction().iteration_seconds());
  auto reported_again = core_->ReportMeasurement(again);
  ASSERT_TRUE(reported_again.ok()) << reported_again.status();
  EXPECT_EQ(reported_again->calibration().time_samples(), 2);
  EXPECT_NEAR(reported_again->calibration().time_factor(), 1.25, 1e-9);
}

// ---------------------------------------------------------------- measurement sanity checks

class MeasurementChecksTest : public PlannerCoreTest {
 protected:
  void SetUp() override {
    PlannerCoreTest::SetUp();
    PlannerCoreOptions options;
    options.measurement_checks.max_step_time_ratio = 3;
    options.measurement_checks.burst_max_reports = 3;
    options.measurement_checks.burst_window_ms = 60'000;
    RecreateCore(options);
    auto plan = Plan(TinyRequest());
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *plan;
  }

  // A measurement of plan_ that agrees with its prediction, from `client`.
  absl::StatusOr<v1::ReportMeasurementResponse> Report(
      const std::string& client, const std::function<void(v1::Measurement*)>& edit = {}) {
    v1::ReportMeasurementRequest report;
    v1::Measurement& m = *report.mutable_measurement();
    m.set_plan_id(plan_.plan_id());
    m.set_peak_reserved_bytes(plan_.prediction().peak_bytes() -
                              plan_.prediction().breakdown().cuda_context_bytes());
    m.set_peak_allocated_bytes(m.peak_reserved_bytes() * 95 / 100);
    m.set_step_seconds(plan_.prediction().iteration_seconds());
    if (edit) edit(&m);
    PlannerCore::MeasurementSource source;
    source.reported_by = "token:" + client;
    source.client = client;
    return core_->ReportMeasurement(report, source);
  }

  std::string CalibrationNow() {
    auto calibrations = core_->GetCalibration(v1::GetCalibrationRequest());
    EXPECT_TRUE(calibrations.ok()) << calibrations.status();
    return calibrations.ok() ? calibrations->SerializeAsString() : "";
  }

  double Quarantined(const std::string& check) {
    for (const auto& family : registry_->Collect()) {
      if (family.name != "memplan_measurements_quarantined_total") continue;
      for (const auto& metric : family.metric) {
        if (metric.label.size() == 1 && metric.label[0].value == check) {
          return metric.counter.value;
        }
      }
    }
    return 0;
  }

  v1::PlanResponse plan_;
};

TEST_F(MeasurementChecksTest, PeakAboveTheCardIsQuarantinedAndLeavesCalibrationAlone) {
  ASSERT_TRUE(Report("agent-1").ok());
  const std::string before = CalibrationNow();
  const int64_t card = FindHardwarePreset("rtx-3090")->gpu_memory_bytes;
  for (const auto& edit : std::vector<std::function<void(v1::Measurement*)>>{
           [&](v1::Measurement* m) { m->set_peak_reserved_bytes(card + 1); },
           [&](v1::Measurement* m) { m->set_peak_device_bytes(2 * card); },
           [&](v1::Measurement* m) { m->set_load_peak_bytes(card + (int64_t{1} << 30)); }}) {
    auto reported = Report("agent-2", edit);
    ASSERT_TRUE(reported.ok()) << reported.status();
    EXPECT_THAT(reported->quarantine_reason(), StartsWith("peak_above_card: "));
    EXPECT_THAT(reported->quarantine_reason(), HasSubstr("is above the card's"));
    EXPECT_FALSE(reported->measurement_id().empty()) << "stored all the same";
    EXPECT_EQ(reported->calibration().samples(), 1) << "the calibration as it stands";
  }
  EXPECT_EQ(CalibrationNow(), before);
  EXPECT_EQ(Quarantined("peak_above_card"), 3);

  // Stored with the reason and the reporter; the accepted one has neither reason nor doubt.
  auto stored = core_->GetPlan([&] {
    v1::GetPlanRequest r;
    r.set_plan_id(plan_.plan_id());
    return r;
  }());
  ASSERT_TRUE(stored.ok());
  ASSERT_EQ(stored->plan().measurements_size(), 4);
  int quarantined = 0;
  for (const v1::Measurement& m : stored->plan().measurements()) {
    quarantined += m.quarantine_reason().empty() ? 0 : 1;
    EXPECT_THAT(m.reported_by(), StartsWith("token:agent-"));
  }
  EXPECT_EQ(quarantined, 3);
}

TEST_F(MeasurementChecksTest, StepTimeFarOutsideThePlansBandIsQuarantined) {
  const double predicted = plan_.prediction().iteration_seconds();
  ASSERT_GT(predicted, 0);
  // Within 3x either way: used.
  for (const double factor : {0.34, 2.9}) {
    auto reported = Report(absl::StrCat("ok-", factor),
                           [&](v1::Measurement* m) { m->set_step_seconds(factor * predicted); });
    ASSERT_TRUE(reported.ok()) << reported.status();
    EXPECT_EQ(reported->quarantine_reason(), "") << factor;
  }
  const std::string before = CalibrationNow();
  for (const double factor : {0.32, 3.1, 1000.0}) {
    auto reported = Report(absl::StrCat("far-", factor),
                           [&](v1::Measurement* m) { m->set_step_seconds(factor * predicted); });
    ASSERT_TRUE(reported.ok()) << reported.status();
    EXPECT_THAT(reported->quarantine_reason(),
                AllOf(StartsWith("step_time_out_of_band: step_seconds = "),
                      HasSubstr("3x around the plan's predicted")))
        << factor;
  }
  EXPECT_EQ(CalibrationNow(), before);
  EXPECT_EQ(Quarantined("step_time_out_of_band"), 3);
  // An OOM report carries no step time: nothing to check.
  auto oom = Report("oom", [](v1::Measurement* m) {
    m->set_oom(true);
    m->set_step_seconds(0);
  });
  ASSERT_TRUE(oom.ok()) << oom.status();
  EXPECT_EQ(oom->quarantine_reason(), "");
}

TEST_F(MeasurementChecksTest, BurstFromOneClientIsQuarantinedWhileItLasts) {
  for (int i = 0; i < 3; ++i) {
    auto reported = Report("agent-1");
    ASSERT_TRUE(reported.ok()) << reported.status();
    EXPECT_EQ(reported->quarantine_reason(), "") << i;
  }
  const std::string before = CalibrationNow();
  for (int i = 0; i < 5; ++i) {
    auto reported = Report("agent-1");
    ASSERT_TRUE(reported.ok()) << reported.status();
    EXPECT_THAT(reported->quarantine_reason(),
                AllOf(StartsWith("burst: "), HasSubstr("from agent-1 within 60 s; at most 3")));
  }
  EXPECT_EQ(CalibrationNow(), before);
  EXPECT_EQ(Quarantined("burst"), 5);
  // Another client is not affected.
  auto other = Report("agent-2");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->quarantine_reason(), "");
  // Once the window has passed, agent-1 counts again.
  clock_ms_ += 61'000;
  auto later = Report("agent-1");
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->quarantine_reason(), "");
}

}  // namespace
}  // namespace memplan
