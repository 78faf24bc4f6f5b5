#include "planner/metrics/planner_metrics.h"

#include <list>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/relative_error.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace memplan {
namespace {

// RPC latencies span sub-millisecond cache hits to multi-second cold searches.
std::vector<double> RpcBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

std::vector<double> SearchBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

// Signed and symmetric around 0 so that under-prediction (negative, [Relative error]) and
// over-prediction are told apart: the planner's target is |error| <= 5 %, hence the fine steps
// near 0.
std::vector<double> RelativeErrorBuckets() {
  return {-0.5, -0.25, -0.1, -0.05, -0.025, -0.01, 0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5};
}

}  // namespace

struct PlannerMetrics::Impl {
  // The two gauges of one plan_id. Null until that side has been observed.
  struct PlanSeries {
    prometheus::Gauge* predicted = nullptr;
    prometheus::Gauge* measured = nullptr;
    std::list<std::string>::iterator recency;
  };

  explicit Impl(prometheus::Registry& registry, const Options& options)
      : max_plan_series(options.max_plan_series < 1 ? 1 : options.max_plan_series),
        rpc_duration(prometheus::BuildHistogram()
                         .Name("memplan_rpc_duration_seconds")
                         .Help("Wall time of planner RPCs by method and gRPC status code.")
                         .Register(registry)),
        search_duration(prometheus::BuildHistogram()
                            .Name("memplan_search_duration_seconds")
                            .Help("Wall time of one plan search.")
                            .Register(registry)
                            .Add({}, SearchBuckets())),
        plans_served(prometheus::BuildCounter()
                         .Name("memplan_plans_served_total")
                         .Help("Plans answered to clients, by verdict.")
                         .Register(registry)),
        plans_served_fit(plans_served.Add({{"fits", "true"}})),
        plans_served_no_fit(plans_served.Add({{"fits", "false"}})),
        predicted_peak(prometheus::BuildGauge()
                           .Name("memplan_plan_predicted_peak_bytes")
                           .Help("Predicted steady-state GPU peak of a recent plan.")
                           .Register(registry)),
        measured_peak(prometheus::BuildGauge()
                          .Name("memplan_plan_measured_peak_bytes")
                          .Help("Measured steady-state GPU peak reported for a recent plan.")
                          .Register(registry)),
        relative_error(
            prometheus::BuildHistogram()
                .Name("memplan_prediction_relative_error")
                .Help(absl::StrCat(kRelativeErrorDefinition,
                                   " reserved peak bytes per measured report (negative: the run "
                                   "used more than predicted; OOM reports are not observed here, "
                                   "see memplan_measurements_oom_total), by hardware, dtype and "
                                   "model family."))
                .Register(registry)),
        measurements_oom(
            prometheus::BuildCounter()
                .Name("memplan_measurements_oom_total")
                .Help("Runs reported as out of memory, by hardware, dtype and model family; not "
                      "in memplan_prediction_relative_error.")
                .Register(registry)),
        last_oom(prometheus::BuildGauge()
                     .Name("memplan_last_oom_timestamp_seconds")
                     .Help("Unix time of the last run reported as out of memory, by hardware, "
                           "dtype and model family.")
                     .Register(registry)),
        stored_measurements(prometheus::BuildGauge()
                                .Name("memplan_stored_measurements")
                                .Help("Measurements held in the planner store.")
                                .Register(registry)
                                .Add({})),
        rpc_rejected(prometheus::BuildCounter()
                         .Name("memplan_rpc_rejected_total")
                         .Help("Write RPCs refused by authorization, by method and gRPC code.")
                         .Register(registry)),
        rpc_refused(prometheus::BuildCounter()
                        .Name("memplan_planner_rpc_refused_total")
                        .Help("RPCs refused before their handler ran (full queue, shutdown, "
                              "undecodable request), by method and reason.")
                        .Register(registry)),
        measurements_quarantined(
            prometheus::BuildCounter()
                .Name("memplan_measurements_quarantined_total")
                .Help("Measurements stored but kept out of calibration, by failed check.")
                .Register(registry)) {
    RegisterBuildInfo(registry);
  }

  // Returns the series of `plan_id`, making it the newest and evicting the oldest beyond the bound.
  PlanSeries& Touch(absl::string_view plan_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::string key(plan_id);
    auto it = plans.find(key);
    if (it != plans.end()) {
      recency.splice(recency.begin(), recency, it->second.recency);
      return it->second;
    }
    recency.push_front(key);
    PlanSeries& series = plans[key];
    series.recency = recency.begin();
    while (static_cast<int>(plans.size()) > max_plan_series) {
      auto oldest = plans.find(recency.back());
      if (oldest->second.predicted != nullptr) predicted_peak.Remove(oldest->second.predicted);
      if (oldest->second.measured != nullptr) measured_peak.Remove(oldest->second.measured);
      plans.erase(oldest);
      recency.pop_back();
    }
    return series;
  }

  const int max_plan_series;
  prometheus::Family<prometheus::Histogram>& rpc_duration;
  prometheus::Histogram& search_duration;
  prometheus::Family<prometheus::Counter>& plans_served;
  prometheus::Counter& plans_served_fit;
  prometheus::Counter& plans_served_no_fit;
  prometheus::Family<prometheus::Gauge>& predicted_peak;
  prometheus::Family<prometheus::Gauge>& measured_peak;
  prometheus::Family<prometheus::Histogram>& relative_error;
  prometheus::Family<prometheus::Counter>& measurements_oom;
  prometheus::Family<prometheus::Gauge>& last_oom;
  prometheus::Gauge& stored_measurements;
  prometheus::Family<prometheus::Counter>& rpc_rejected;
  prometheus::Family<prometheus::Counter>& rpc_refused;
  prometheus::Family<prometheus::Counter>& measurements_quarantined;

  // Family::Add is itself thread-safe, but eviction must not race a concurrent Set on a gauge
  // that is being removed, so all plan_id series go through this lock.
  mutable absl::Mutex mu;
  std::map<std::string, PlanSeries> plans ABSL_GUARDED_BY(mu);
  std::list<std::string> recency ABSL_GUARDED_BY(mu);  // front = newest
};

PlannerMetrics::PlannerMetrics(std::shared_ptr<prometheus::Registry> registry)
    : PlannerMetrics(std::move(registry), Options()) {}

PlannerMetrics::PlannerMetrics(std::shared_ptr<prometheus::Registry> registry,
                               const Options& options)
    : impl_(std::make_unique<Impl>(*registry, options)) {}

PlannerMetrics::~PlannerMetrics() = default;

void PlannerMetrics::ObserveRpc(absl::string_view method, absl::string_view code, double seconds) {
  // Family::Add returns the existing series for known labels, so repeated calls are cheap lookups.
  impl_->rpc_duration
      .Add({{"method", std::string(method)}, {"code", std::string(code)}}, RpcBuckets())
      .Observe(seconds);
}

void PlannerMetrics::RpcRejected(absl::string_view method, absl::string_view code) {
  impl_->rpc_rejected.Add({{"method", std::string(method)}, {"code", std::string(code)}})
      .Increment();
}

void PlannerMetrics::RpcRefused(absl::string_view method, absl::string_view reason) {
  impl_->rpc_refused.Add({{"method", std::string(method)}, {"reason", std::string(reason)}})
      .Increment();
}

void PlannerMetrics::MeasurementQuarantined(absl::string_view check) {
  impl_->measurements_quarantined.Add({{"check", std::string(check)}}).Increment();
}

void PlannerMetrics::ObserveSearch(double seconds) { impl_->search_duration.Observe(seconds); }

void PlannerMetrics::PlanServed(bool fits) {
  (fits ? impl_->plans_served_fit : impl_->plans_served_no_fit).Increment();
}

void PlannerMetrics::ObservePlanPrediction(absl::string_view plan_id,
                                           int64_t predicted_peak_bytes) {
  absl::MutexLock lock(&impl_->mu);
  Impl::PlanSeries& series = impl_->Touch(plan_id);
  if (series.predicted == nullptr) {
    series.predicted = &impl_->predicted_peak.Add({{"plan_id", std::string(plan_id)}});
  }
  series.predicted->Set(static_cast<double>(predicted_peak_bytes));
}

void PlannerMetrics::ObserveMeasurement(absl::string_view plan_id, int64_t predicted_bytes,
                                        int64_t measured_bytes, const ErrorKey& key) {
  {
    absl::MutexLock lock(&impl_->mu);
    Impl::PlanSeries& series = impl_->Touch(plan_id);
    const std::string id(plan_id);
    if (series.predicted == nullptr)
      series.predicted = &impl_->predicted_peak.Add({{"plan_id", id}});
    if (series.measured == nullptr) series.measured = &impl_->measured_peak.Add({{"plan_id", id}});
    series.predicted->Set(static_cast<double>(predicted_bytes));
    series.measured->Set(static_cast<double>(measured_bytes));
  }
  if (const std::optional<double> error = RelativeError(predicted_bytes, measured_bytes)) {
    impl_->relative_error
        .Add({{"hardware", key.hardware}, {"dtype", key.dtype}, {"family", key.family}},
             RelativeErrorBuckets())
        .Observe(*error);
  }
}

void PlannerMetrics::ObserveOom(absl::string_view plan_id, int64_t predicted_bytes,
                                const ErrorKey& key, double unix_seconds) {
  ObservePlanPrediction(plan_id, predicted_bytes);
  const prometheus::Labels labels = {
      {"hardware", key.hardware}, {"dtype", key.dtype}, {"family", key.family}};
  impl_->measurements_oom.Add(labels).Increment();
  // [OOM alert] A counter series born at 1 shows no increase() to Prometheus, so the first OOM of
  // a key would not alert on the counter; the time of the last one does, from the first report.
  impl_->last_oom.Add(labels).Set(unix_seconds);
}

void PlannerMetrics::SetStoredMeasurements(int64_t n) {
  impl_->stored_measurements.Set(static_cast<double>(n));
}

int PlannerMetrics::TrackedPlanCount() const {
  absl::MutexLock lock(&impl_->mu);
  return static_cast<int>(impl_->plans.size());
}

}  // namespace memplan
