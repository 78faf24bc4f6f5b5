// Private to planner/store: the rules both Store implementations share — id format, the trace
// matching key, the ListPlans page token, dtype mapping and input checks — so the fake and the
// real store cannot drift apart. Functions are pure except NewId (it calls the env's source).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/types.h"
#include "memplan/v1/planner.pb.h"
#include "planner/store/store.h"

namespace memplan::store_internal {

// Fills unset clock / random source with the system clock and a seeded generator.
StoreEnv WithDefaults(StoreEnv env);

// prefix + "-" + 16 lower-case hex digits, e.g. "plan-0f3a...".
std::string NewId(absl::string_view prefix, const StoreEnv& env);

// Deterministic bytes identifying what a profiled trace is reusable for (see Store::FindTrace).
std::string TraceMatchKey(const memplan::v1::Trace& trace);

// Opaque keyset cursor over plan insertion order.
std::string EncodePlanPageToken(int64_t last_seq);
absl::StatusOr<int64_t> DecodePlanPageToken(absl::string_view token);  // INVALID_ARGUMENT
// page_size 0 -> default; outside [0, kMaxListPlansPageSize] -> INVALID_ARGUMENT.
absl::StatusOr<int> CheckPageSize(int page_size);

// A validated ListPlans request: at most `limit` plans with insertion sequence < `before_seq`.
struct PlanPageRequest {
  int limit = 0;
  int64_t before_seq = 0;
};
absl::StatusOr<PlanPageRequest> ParsePlanPageRequest(int page_size, absl::string_view page_token);

memplan::v1::DType ToProtoDType(DType dtype);

absl::Status CheckMeasurement(const memplan::v1::Measurement& m);
absl::Status CheckCalibration(const memplan::v1::Calibration& c);
absl::Status CheckSampleLimit(int limit);
// The options both stores share; INVALID_ARGUMENT naming the field and its range.
absl::Status CheckStoreLimits(int max_measurements_per_plan, const PlanRetention& retention,
                              int64_t max_list_page_bytes);

}  // namespace memplan::store_internal
