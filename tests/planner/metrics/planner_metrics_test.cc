#include "planner/metrics/planner_metrics.h"

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace memplan {
namespace {

using ::prometheus::ClientMetric;
using ::prometheus::MetricFamily;
using ::testing::UnorderedElementsAre;

// Finds one series of `family_name` whose labels include every (name, value) in `labels`.
std::optional<ClientMetric> FindSeries(prometheus::Registry& registry,
                                       const std::string& family_name,
                                       const std::vector<ClientMetric::Label>& labels) {
  for (const MetricFamily& family : registry.Collect()) {
    if (family.name != family_name) continue;
    for (const ClientMetric& metric : family.metric) {
      bool all = true;
      for (const ClientMetric::Label& want : labels) {
        bool found = false;
        for (const ClientMetric::Label& have : metric.label) found |= have == want;
        all &= found;
      }
      if (all) return metric;
    }
  }
  return std::nullopt;
}

// The plan_id values that currently have a series in `family_name`.
std::vector<std::string> PlanIds(prometheus::Registry& registry, const std::string& family_name) {
  std::vector<std::string> ids;
  for (const MetricFamily& family : registry.Collect()) {
    if (family.name != family_name) continue;
    for (const ClientMetric& metric : family.metric) {
      for (const ClientMetric::Label& label : metric.label) {
        if (label.name == "plan_id") ids.push_back(label.value);
      }
    }
  }
  return ids;
}

// Cumulative count of the bucket whose upper bound is `le`.
uint64_t BucketCount(const ClientMetric& metric, double le) {
  for (const ClientMetric::Bucket& bucket : metric.histogram.bucket) {
    if (bucket.upper_bound == le) return bucket.cumulative_count;
  }
  ADD_FAILURE() << "no bucket le=" << le;
  return 0;
}

class PlannerMetricsTest : public ::testing::Test {
 protected:
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
};

TEST_F(PlannerMetricsTest, RpcDurationsAreSplitByMethodAndCode) {
  PlannerMetrics metrics(registry_);
  metrics.ObserveRpc("Plan", "OK", 0.002);
  metrics.ObserveRpc("Plan", "OK", 0.004);
  metrics.ObserveRpc("Plan", "INVALID_ARGUMENT", 0.0001);
  metrics.ObserveRpc("SubmitTrace", "OK", 0.3);

  auto plan_ok =
      FindSeries(*registry_, "memplan_rpc_duration_seconds", {{"method", "Plan"}, {"code", "OK"}});
  ASSERT_TRUE(plan_ok.has_value());
  EXPECT_EQ(plan_ok->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(plan_ok->histogram.sample_sum, 0.006);
  EXPECT_EQ(BucketCount(*plan_ok, 0.0025), 1u);
  EXPECT_EQ(BucketCount(*plan_ok, 0.005), 2u);

  auto plan_bad = FindSeries(*registry_, "memplan_rpc_duration_seconds",
                             {{"method", "Plan"}, {"code", "INVALID_ARGUMENT"}});
  ASSERT_TRUE(plan_bad.has_value());
  EXPECT_EQ(plan_bad->histogram.sample_count, 1u);

  auto trace = FindSeries(*registry_, "memplan_rpc_duration_seconds",
                          {{"method", "SubmitTrace"}, {"code", "OK"}});
  ASSERT_TRUE(trace.has_value());
  EXPECT_EQ(BucketCount(*trace, 0.25), 0u);
  EXPECT_EQ(BucketCount(*trace, 0.5), 1u);
}

TEST_F(PlannerMetricsTest, SearchDurationIsAHistogram) {
  PlannerMetrics metrics(registry_);
  metrics.ObserveSearch(0.02);
  metrics.ObserveSearch(1.5);
  auto search = FindSeries(*registry_, "memplan_search_duration_seconds", {});
  ASSERT_TRUE(search.has_value());
  EXPECT_EQ(search->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(search->histogram.sample_sum, 1.52);
  EXPECT_EQ(BucketCount(*search, 0.025), 1u);
  EXPECT_EQ(BucketCount(*search, 2.5), 2u);
}

TEST_F(PlannerMetricsTest, PlansServedCountsEachVerdict) {
  PlannerMetrics metrics(registry_);
  metrics.PlanServed(true);
  metrics.PlanServed(true);
  metrics.PlanServed(false);
  auto fit = FindSeries(*registry_, "memplan_plans_served_total", {{"fits", "true"}});
  auto no_fit = FindSeries(*registry_, "memplan_plans_served_total", {{"fits", "false"}});
  ASSERT_TRUE(fit.has_value());
  ASSERT_TRUE(no_fit.has_value());
  EXPECT_EQ(fit->counter.value, 2);
  EXPECT_EQ(no_fit->counter.value, 1);
}

TEST_F(PlannerMetricsTest, PredictionAndMeasurementSetPerPlanGauges) {
  PlannerMetrics metrics(registry_);
  metrics.ObservePlanPrediction("plan-a", 70'000'000'000);
  auto predicted =
      FindSeries(*registry_, "memplan_plan_predicted_peak_bytes", {{"plan_id", "plan-a"}});
  ASSERT_TRUE(predicted.has_value());
  EXPECT_EQ(predicted->gauge.value, 70e9);
  // No measurement yet: no measured series for this plan.
  EXPECT_FALSE(FindSeries(*registry_, "memplan_plan_measured_peak_bytes", {{"plan_id", "plan-a"}}));

  metrics.ObserveMeasurement("plan-a", 70'000'000'000, 72'100'000'000);
  auto measured =
      FindSeries(*registry_, "memplan_plan_measured_peak_bytes", {{"plan_id", "plan-a"}});
  ASSERT_TRUE(measured.has_value());
  EXPECT_EQ(measured->gauge.value, 72.1e9);
  // Large byte counts survive the double gauge exactly (below 2^53).
  metrics.ObservePlanPrediction("plan-a", (int64_t{1} << 52) + 1);
  predicted = FindSeries(*registry_, "memplan_plan_predicted_peak_bytes", {{"plan_id", "plan-a"}});
  EXPECT_EQ(static_cast<int64_t>(predicted->gauge.value), (int64_t{1} << 52) + 1);
}

TEST_F(PlannerMetricsTest, RelativeErrorIsSignedAndBucketedAroundZero) {
  PlannerMetrics metrics(registry_);
  // [Relative error]: (predicted - measured) / measured.
  metrics.ObserveMeasurement("over", 1030, 1000);     // +3 %: memory left unused
  metrics.ObserveMeasurement("under", 800, 1000);     // -20 %: the run used more than predicted
  metrics.ObserveMeasurement("exact", 1000, 1000);    // 0
  metrics.ObserveMeasurement("no-measure", 500, 0);   // nothing measured: no error recorded
  auto error = FindSeries(*registry_, "memplan_prediction_relative_error", {});
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->histogram.sample_count, 3u);
  EXPECT_NEAR(error->histogram.sample_sum, 0.03 - 0.2, 1e-12);
  EXPECT_EQ(BucketCount(*error, -0.25), 0u);
  EXPECT_EQ(BucketCount(*error, -0.1), 1u);
  EXPECT_EQ(BucketCount(*error, 0), 2u);
  EXPECT_EQ(BucketCount(*error, 0.025), 2u);
  EXPECT_EQ(BucketCount(*error, 0.05), 3u);
}

TEST_F(PlannerMetricsTest, OomIsCountedApartNeverAsAnErrorOrAPeak) {
  PlannerMetrics metrics(registry_);
  const PlannerMetrics::ErrorKey h100{"h100-80gb", "bf16", "llama"};
  metrics.ObserveMeasurement("measured", 1000, 1010, h100);
  metrics.ObserveOom("oom-a", 1000, h100, 1'700'000'000);
  metrics.ObserveOom("oom-b", 2000, h100, 1'700'000'060.5);
  metrics.ObserveOom("oom-c", 3000, {"rtx-4090", "bf16", "qwen3"}, 1'700'000'030);
  auto oom = FindSeries(*registry_, "memplan_measurements_oom_total",
                        {{"hardware", "h100-80gb"}, {"dtype", "bf16"}, {"family", "llama"}});
  ASSERT_TRUE(oom.has_value());
  EXPECT_EQ(oom->counter.value, 2);
  auto rtx = FindSeries(*registry_, "memplan_measurements_oom_total", {{"hardware", "rtx-4090"}});
  ASSERT_TRUE(rtx.has_value());
  EXPECT_EQ(rtx->counter.value, 1);
  auto last = FindSeries(*registry_, "memplan_last_oom_timestamp_seconds",
                         {{"hardware", "h100-80gb"}, {"family", "llama"}});
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->gauge.value, 1'700'000'060.5);
  // The error histogram holds the one measured report only: an OOM lowers no bucket.
  auto error = FindSeries(*registry_, "memplan_prediction_relative_error", {});
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->histogram.sample_count, 1u);
  EXPECT_EQ(BucketCount(*error, -0.5), 0u);
  // The OOM plans keep their prediction and get no measured peak (no 0 beside it).
  EXPECT_THAT(PlanIds(*registry_, "memplan_plan_measured_peak_bytes"),
              UnorderedElementsAre("measured"));
  auto predicted =
      FindSeries(*registry_, "memplan_plan_predicted_peak_bytes", {{"plan_id", "oom-b"}});
  ASSERT_TRUE(predicted.has_value());
  EXPECT_EQ(predicted->gauge.value, 2000);
}

TEST_F(PlannerMetricsTest, RelativeErrorIsAggregatedByHardwareDtypeAndFamily) {
  PlannerMetrics metrics(registry_);
  metrics.ObserveMeasurement("a", 1100, 1000, {"h100-80gb", "bf16", "llama"});
  metrics.ObserveMeasurement("b", 900, 1000, {"h100-80gb", "bf16", "llama"});
  metrics.ObserveMeasurement("c", 1000, 1000, {"rtx-4090", "bf16", "qwen3"});
  auto h100 = FindSeries(*registry_, "memplan_prediction_relative_error",
                         {{"hardware", "h100-80gb"}, {"dtype", "bf16"}, {"family", "llama"}});
  ASSERT_TRUE(h100.has_value());
  EXPECT_EQ(h100->histogram.sample_count, 2u);
  auto rtx = FindSeries(*registry_, "memplan_prediction_relative_error",
                        {{"hardware", "rtx-4090"}, {"family", "qwen3"}});
  ASSERT_TRUE(rtx.has_value());
  EXPECT_EQ(rtx->histogram.sample_count, 1u);
  // No plan_id label: one series per key however many plans were measured.
  for (const ClientMetric::Label& label : h100->label) EXPECT_NE(label.name, "plan_id");
}

TEST_F(PlannerMetricsTest, PlanSeriesAreBoundedToTheNewestPlans) {
  PlannerMetrics::Options options;
  options.max_plan_series = 3;
  PlannerMetrics metrics(registry_, options);
  for (int i = 0; i < 5; ++i) metrics.ObservePlanPrediction(absl::StrCat("p", i), 100 + i);
  EXPECT_EQ(metrics.TrackedPlanCount(), 3);
  EXPECT_THAT(PlanIds(*registry_, "memplan_plan_predicted_peak_bytes"),
              UnorderedElementsAre("p2", "p3", "p4"));

  // Touching p2 makes it the newest, so the next new plan evicts p3 instead; a measurement
  // counts as a touch and its measured series is evicted together with the predicted one.
  metrics.ObserveMeasurement("p2", 102, 110);
  metrics.ObserveMeasurement("p3", 103, 104);
  metrics.ObservePlanPrediction("p2", 102);
  metrics.ObservePlanPrediction("p5", 105);
  metrics.ObservePlanPrediction("p6", 106);
  EXPECT_THAT(PlanIds(*registry_, "memplan_plan_predicted_peak_bytes"),
              UnorderedElementsAre("p2", "p5", "p6"));
  EXPECT_THAT(PlanIds(*registry_, "memplan_plan_measured_peak_bytes"), UnorderedElementsAre("p2"));
  // An evicted plan that comes back gets fresh series.
  metrics.ObservePlanPrediction("p0", 7);
  auto p0 = FindSeries(*registry_, "memplan_plan_predicted_peak_bytes", {{"plan_id", "p0"}});
  ASSERT_TRUE(p0.has_value());
  EXPECT_EQ(p0->gauge.value, 7);
}

TEST_F(PlannerMetricsTest, StoredMeasurementsGauge) {
  PlannerMetrics metrics(registry_);
  metrics.SetStoredMeasurements(100'000);
  auto stored = FindSeries(*registry_, "memplan_stored_measurements", {});
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->gauge.value, 100'000);
  metrics.SetStoredMeasurements(3);
  EXPECT_EQ(FindSeries(*registry_, "memplan_stored_measurements", {})->gauge.value, 3);
}

TEST_F(PlannerMetricsTest, ConcurrentObserversKeepTheBoundAndCounts) {
  PlannerMetrics::Options options;
  options.max_plan_series = 16;
  PlannerMetrics metrics(registry_, options);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = absl::StrCat("t", t, "-", i % 40);
        metrics.ObservePlanPrediction(id, i);
        metrics.ObserveMeasurement(id, 1000, 1000 + i % 7);
        metrics.ObserveRpc("Plan", "OK", 0.001);
        metrics.PlanServed(i % 2 == 0);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(metrics.TrackedPlanCount(), 16);
  EXPECT_EQ(PlanIds(*registry_, "memplan_plan_predicted_peak_bytes").size(), 16u);
  EXPECT_EQ(PlanIds(*registry_, "memplan_plan_measured_peak_bytes").size(), 16u);
  EXPECT_EQ(FindSeries(*registry_, "memplan_rpc_duration_seconds", {{"method", "Plan"}})
                ->histogram.sample_count,
            static_cast<uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(FindSeries(*registry_, "memplan_plans_served_total", {{"fits", "true"}})->counter.value,
            kThreads * kPerThread / 2);
  EXPECT_EQ(FindSeries(*registry_, "memplan_prediction_relative_error", {})->histogram.sample_count,
            static_cast<uint64_t>(kThreads * kPerThread));
}

}  // namespace
}  // namespace memplan
