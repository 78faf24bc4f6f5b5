// MemoryStore: the Store fake for tests — same ids, ordering, errors and page tokens as
// SqliteStore (both use store_keys.h), nothing durable.

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "planner/store/store.h"
#include "planner/store/store_keys.h"

namespace memplan {
namespace {

namespace v1 = memplan::v1;

struct StoredTrace {
  std::string match_key;
  v1::Trace trace;
};
struct StoredSample {
  int64_t seq;
  CalibrationSample sample;
};
// name, dtype, family, method, optimizer: SqliteStore's primary key and order.
using CalibrationRowKey = std::tuple<std::string, int, std::string, std::string, std::string>;

CalibrationRowKey RowKey(const CalibrationKey& key) {
  return {key.hardware_name, store_internal::ToProtoDType(key.param_dtype), key.model_family,
          key.method, key.optimizer};
}

class MemoryStore final : public Store {  // thread-safe: everything behind mu_
 public:
  explicit MemoryStore(const MemoryStoreOptions& options)
      : options_(options), env_(store_internal::WithDefaults(options.env)) {}

  absl::StatusOr<std::string> PutTrace(const v1::Trace& trace) override {
    StoredTrace stored{store_internal::TraceMatchKey(trace), trace};
    stored.trace.set_trace_id(store_internal::NewId("trace", env_));
    std::string id = stored.trace.trace_id();
    absl::MutexLock lock(&mu_);
    if (trace_seq_by_id_.contains(id)) return absl::AlreadyExistsError(id);
    const int64_t seq = ++next_seq_;
    trace_seq_by_id_[id] = seq;
    traces_[seq] = std::move(stored);
    return id;
  }

  absl::StatusOr<v1::Trace> GetTrace(absl::string_view trace_id) override {
    absl::MutexLock lock(&mu_);
    auto it = trace_seq_by_id_.find(std::string(trace_id));
    if (it == trace_seq_by_id_.end()) {
      return absl::NotFoundError(absl::StrCat("trace_id '", trace_id, "' not found"));
    }
    return traces_.at(it->second).trace;
  }

  absl::StatusOr<std::optional<v1::Trace>> FindTrace(const v1::Trace& key) override {
    const std::string match = store_internal::TraceMatchKey(key);
    absl::MutexLock lock(&mu_);
    for (auto it = traces_.rbegin(); it != traces_.rend(); ++it) {
      if (it->second.match_key == match && !it->second.trace.analytic()) return it->second.trace;
    }
    return std::optional<v1::Trace>();
  }

  absl::StatusOr<std::string> PutHardwareProfile(const v1::HardwareProfile& profile) override {
    std::string id = store_internal::NewId("hw", env_);
    absl::MutexLock lock(&mu_);
    if (profile_seq_by_id_.contains(id)) return absl::AlreadyExistsError(id);
    const int64_t seq = ++next_seq_;
    profile_seq_by_id_[id] = seq;
    profiles_[seq] = profile;
    return id;
  }

  absl::StatusOr<v1::HardwareProfile> GetHardwareProfile(absl::string_view profile_id) override {
    absl::MutexLock lock(&mu_);
    auto it = profile_seq_by_id_.find(std::string(profile_id));
    if (it == profile_seq_by_id_.end()) {
      return absl::NotFoundError(absl::StrCat("hardware_profile_id '", profile_id, "' not found"));
    }
    return profiles_.at(it->second);
  }

  absl::StatusOr<std::optional<v1::HardwareProfile>> FindHardwareProfileByName(
      absl::string_view name) override {
    absl::MutexLock lock(&mu_);
    for (auto it = profiles_.rbegin(); it != profiles_.rend(); ++it) {
      if (it->second.name() == name && it->second.measured()) return it->second;
    }
    return std::optional<v1::HardwareProfile>();
  }

  absl::StatusOr<std::string> PutPlan(const v1::StoredPlan& plan) override {
    v1::StoredPlan stored = plan;
    stored.clear_measurements();
    if (stored.plan_id().empty()) stored.set_plan_id(store_internal::NewId("plan", env_));
    if (stored.created_at_unix_ms() == 0) stored.set_created_at_unix_ms(env_.now_unix_ms());
    std::string id = stored.plan_id();
    absl::MutexLock lock(&mu_);
    if (plan_seq_by_id_.contains(id)) {
      return absl::AlreadyExistsError(absl::StrCat("plan_id '", id, "' already exists"));
    }
    const int64_t seq = ++next_seq_;
    plan_seq_by_id_[id] = seq;
    plans_[seq] = std::move(stored);
    plan_ordinal_by_seq_[seq] = ++plans_inserted_;
    if (++puts_since_retention_ >= options_.plan_retention.check_every_puts) {
      puts_since_retention_ = 0;
      EnforceRetention();
    }
    return id;
  }

  absl::StatusOr<v1::StoredPlan> GetPlan(absl::string_view plan_id) override {
    absl::MutexLock lock(&mu_);
    auto it = plan_seq_by_id_.find(std::string(plan_id));
    if (it == plan_seq_by_id_.end()) {
      return absl::NotFoundError(absl::StrCat("plan_id '", plan_id, "' not found"));
    }
    v1::StoredPlan plan = plans_.at(it->second);
    auto m = measurements_by_plan_.find(plan.plan_id());
    if (m != measurements_by_plan_.end()) {
      const std::vector<v1::Measurement>& all = m->second;
      for (auto r = all.rbegin();
           r != all.rend() && plan.measurements_size() < options_.max_measurements_per_plan; ++r) {
        *plan.add_measurements() = *r;
      }
    }
    return plan;
  }

  absl::StatusOr<ListPlansPage> ListPlans(int page_size, absl::string_view page_token) override {
    ASSIGN_OR_RETURN(const store_internal::PlanPageRequest request,
                     store_internal::ParsePlanPageRequest(page_size, page_token));
    const int limit = request.limit;
    const int64_t before_seq = request.before_seq;
    absl::MutexLock lock(&mu_);
    ListPlansPage page;
    int64_t last_seq = 0;
    int64_t page_bytes = 0;
    for (auto it = std::make_reverse_iterator(plans_.lower_bound(before_seq)); it != plans_.rend();
         ++it) {
      // The same framing allowance as SqliteStore (kListPlanOverheadBytes there).
      const int64_t plan_bytes = static_cast<int64_t>(it->second.ByteSizeLong()) + 64;
      if (static_cast<int>(page.plans.size()) == limit ||
          (!page.plans.empty() && page_bytes + plan_bytes > options_.max_list_page_bytes)) {
        page.next_page_token = store_internal::EncodePlanPageToken(last_seq);
        break;
      }
      last_seq = it->first;
      page_bytes += plan_bytes;
      page.plans.push_back(it->second);
    }
    return page;
  }

  absl::StatusOr<std::string> PutMeasurement(const v1::Measurement& m) override {
    ASSIGN_OR_RETURN(std::vector<std::string> ids, PutMeasurements({m}));
    return std::move(ids.front());
  }

  absl::StatusOr<std::vector<std::string>> PutMeasurements(
      absl::Span<const v1::Measurement> measurements) override {
    for (const v1::Measurement& m : measurements) {
      RETURN_IF_ERROR(store_internal::CheckMeasurement(m));
    }
    const int64_t now_ms = env_.now_unix_ms();
    absl::MutexLock lock(&mu_);
    // All-or-nothing, like the SQLite transaction: check everything before changing anything.
    for (const v1::Measurement& m : measurements) {
      if (!plan_seq_by_id_.contains(m.plan_id())) {
        return absl::NotFoundError(
            absl::StrCat("measurement.plan_id '", m.plan_id(), "' is not a stored plan"));
      }
    }
    std::vector<std::string> ids;
    for (const v1::Measurement& m : measurements) {
      v1::Measurement stored = m;
      if (stored.measured_at_unix_ms() == 0) stored.set_measured_at_unix_ms(now_ms);
      measurements_by_plan_[stored.plan_id()].push_back(std::move(stored));
      ids.push_back(store_internal::NewId("meas", env_));
      ++measurement_count_;
    }
    return ids;
  }

  absl::StatusOr<int64_t> CountMeasurements() override {
    absl::MutexLock lock(&mu_);
    return measurement_count_;
  }

  absl::StatusOr<std::vector<CalibrationSample>> RecentCalibrationSamples(const CalibrationKey& key,
                                                                          int limit) override {
    RETURN_IF_ERROR(store_internal::CheckSampleLimit(limit));
    absl::MutexLock lock(&mu_);
    auto it = samples_.find(RowKey(key));
    if (it == samples_.end()) return std::vector<CalibrationSample>();
    std::vector<StoredSample> rows = it->second;
    std::sort(rows.begin(), rows.end(), [](const StoredSample& a, const StoredSample& b) {
      return std::tie(a.sample.measured_at_unix_ms, a.seq) >
             std::tie(b.sample.measured_at_unix_ms, b.seq);
    });
    std::vector<CalibrationSample> out;
    for (const StoredSample& row : rows) {
      if (static_cast<int>(out.size()) == limit) break;
      out.push_back(row.sample);
    }
    return out;
  }

  absl::Status PutCalibrationSample(const CalibrationKey& key,
                                    const CalibrationSample& sample) override {
    CalibrationSample stored = sample;
    if (stored.measured_at_unix_ms == 0) stored.measured_at_unix_ms = env_.now_unix_ms();
    absl::MutexLock lock(&mu_);
    samples_[RowKey(key)].push_back({++next_seq_, stored});
    return absl::OkStatus();
  }

  absl::Status PutCalibration(const v1::Calibration& c) override {
    RETURN_IF_ERROR(store_internal::CheckCalibration(c));
    v1::Calibration stored = c;
    if (stored.updated_at_unix_ms() == 0) stored.set_updated_at_unix_ms(env_.now_unix_ms());
    absl::MutexLock lock(&mu_);
    calibrations_[{c.hardware_name(), c.param_dtype(), c.model_family(), c.method(),
                   c.optimizer()}] = std::move(stored);
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<v1::Calibration>> GetCalibration(
      const CalibrationKey& key) override {
    absl::MutexLock lock(&mu_);
    auto it = calibrations_.find(RowKey(key));
    if (it == calibrations_.end()) return std::optional<v1::Calibration>();
    return it->second;
  }

  absl::StatusOr<std::vector<v1::Calibration>> ListCalibrations(
      const CalibrationFilter& filter) override {
    const int dtype =
        filter.param_dtype.has_value() ? store_internal::ToProtoDType(*filter.param_dtype) : 0;
    absl::MutexLock lock(&mu_);
    std::vector<v1::Calibration> out;
    for (const auto& [key, c] : calibrations_) {  // the map orders as SqliteStore's ORDER BY
      if (!filter.hardware_name.empty() && std::get<0>(key) != filter.hardware_name) continue;
      if (dtype != 0 && std::get<1>(key) != dtype) continue;
      if (!filter.model_family.empty() && std::get<2>(key) != filter.model_family) continue;
      out.push_back(c);
    }
    return out;
  }

  absl::Status CheckIntegrity(IntegrityCheck) override { return absl::OkStatus(); }

  StoreCounters Counters() const override {
    absl::MutexLock lock(&mu_);
    StoreCounters counters;
    counters.plans_expired = plans_expired_;
    return counters;
  }

 private:
  // SqliteStore's rule: keep the newest max_plans inserted and those younger than max_age;
  // plans with measurements always.
  void EnforceRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const PlanRetention& retention = options_.plan_retention;
    const int64_t cutoff_ms = retention.max_age_seconds > 0
                                  ? env_.now_unix_ms() - retention.max_age_seconds * 1000
                                  : INT64_MIN;
    for (auto it = plans_.begin(); it != plans_.end();) {
      const int64_t ordinal = plan_ordinal_by_seq_.at(it->first);
      const bool beyond_count =
          retention.max_plans > 0 && ordinal <= plans_inserted_ - retention.max_plans;
      const bool too_old = it->second.created_at_unix_ms() < cutoff_ms;
      if ((beyond_count || too_old) && !measurements_by_plan_.contains(it->second.plan_id())) {
        plan_seq_by_id_.erase(it->second.plan_id());
        plan_ordinal_by_seq_.erase(it->first);
        it = plans_.erase(it);
        ++plans_expired_;
      } else {
        ++it;
      }
    }
  }

  const MemoryStoreOptions options_;
  const StoreEnv env_;
  mutable absl::Mutex mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t plans_inserted_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, int64_t> plan_ordinal_by_seq_ ABSL_GUARDED_BY(mu_);
  int puts_since_retention_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t plans_expired_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, StoredTrace> traces_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> trace_seq_by_id_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, v1::HardwareProfile> profiles_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> profile_seq_by_id_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, v1::StoredPlan> plans_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> plan_seq_by_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<v1::Measurement>> measurements_by_plan_ ABSL_GUARDED_BY(mu_);
  int64_t measurement_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<CalibrationRowKey, std::vector<StoredSample>> samples_ ABSL_GUARDED_BY(mu_);
  std::map<CalibrationRowKey, v1::Calibration> calibrations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore() { return NewMemoryStore(MemoryStoreOptions{}); }

std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options) {
  return std::make_unique<MemoryStore>(options);
}

}  // namespace memplan
