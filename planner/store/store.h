// The planner's persistent state behind a narrow interface: traces, hardware profiles, plans,
// measurements and calibration. SqliteStore (OpenSqliteStore) is the real one; MemoryStore
// (NewMemoryStore) is a fake with the same semantics for tests. All implementations are
// thread-safe. See planner/store/README.md for the schema and durability guarantees.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "common/validate.h"  // kMaxListPlansPageSize
#include "memplan/v1/planner.pb.h"
#include "planner/calibration/calibration_sample.h"

namespace memplan {

struct ListPlansPage {
  std::vector<memplan::v1::StoredPlan> plans;  // newest first, measurements omitted
  std::string next_page_token;                 // empty on the last page
};

// Empty / unset fields match everything.
struct CalibrationFilter {
  std::string hardware_name;
  std::optional<DType> param_dtype;
  std::string model_family;
};

inline constexpr int kDefaultListPlansPageSize = 50;
// A ListPlans page stops before the plan that would take it past this many encoded bytes, so a
// ListPlansResponse stays well under gRPC's default 4 MiB receive limit.
inline constexpr int64_t kDefaultListPlansPageBytes = int64_t{3} << 20;

// How thoroughly the SQLite file is checked: kQuick is PRAGMA quick_check (every page's b-tree
// structure, O(file size)), kFull is PRAGMA integrity_check (also index contents, slower).
enum class IntegrityCheck { kOff, kQuick, kFull };

// Counts since the store was opened.
struct StoreCounters {
  int64_t corrupt_rows_skipped = 0;  // calibration rows whose checksum did not match
  int64_t plans_expired = 0;         // plans deleted by PlanRetention
};

// Which stored plans are kept. Plans are made by unauthenticated Plan and Admit calls, so their
// number is capped; a plan with measurements is always kept (it is calibration evidence).
struct PlanRetention {
  int64_t max_plans = 100000;               // keep the newest N inserted; 0 = no cap
  int64_t max_age_seconds = 30 * 24 * 3600;  // by created_at_unix_ms; 0 = no limit
  int check_every_puts = 100;               // enforced at open and on every Nth PutPlan
};

class Store {  // implementations are thread-safe
 public:
  virtual ~Store() = default;

  // Stores a copy of the trace under a new id ("trace-" + 16 hex), returned. trace_id is ignored.
  virtual absl::StatusOr<std::string> PutTrace(const memplan::v1::Trace& trace) = 0;
  virtual absl::StatusOr<memplan::v1::Trace> GetTrace(absl::string_view trace_id) = 0;  // NOT_FOUND
  // Newest stored *profiled* (analytic == false) trace for the same model arch + workload +
  // dtype + training + hardware name as `key` (defaults normalised: head_dim 0, world_size 0,
  // grad_accum 0, training kind unspecified, LoRA module order). nullopt when none.
  virtual absl::StatusOr<std::optional<memplan::v1::Trace>> FindTrace(
      const memplan::v1::Trace& key) = 0;

  // New id "hw-" + 16 hex.
  virtual absl::StatusOr<std::string> PutHardwareProfile(const memplan::v1::HardwareProfile& p) = 0;
  virtual absl::StatusOr<memplan::v1::HardwareProfile> GetHardwareProfile(
      absl::string_view profile_id) = 0;  // NOT_FOUND
  // Newest profile with that name and measured == true; nullopt when none.
  virtual absl::StatusOr<std::optional<memplan::v1::HardwareProfile>> FindHardwareProfileByName(
      absl::string_view name) = 0;

  // Assigns plan_id ("plan-" + 16 hex) when empty and created_at_unix_ms (now) when 0; the
  // plan's measurements field is ignored (use PutMeasurement). ALREADY_EXISTS for a known id.
  virtual absl::StatusOr<std::string> PutPlan(const memplan::v1::StoredPlan& plan) = 0;
  // The plan with its newest measurements (at most max_measurements_per_plan, newest first).
  virtual absl::StatusOr<memplan::v1::StoredPlan> GetPlan(absl::string_view plan_id) = 0;
  // Newest first (by insertion). page_size 0 = 50; outside [0, 1000] or a malformed
  // page_token -> INVALID_ARGUMENT naming the field. The token is opaque (keyset pagination).
  // A page also ends before the plan that would take the plans' encoded size (plus 64 bytes
  // each for framing) past the store's max_list_page_bytes; it holds at least one plan.
  virtual absl::StatusOr<ListPlansPage> ListPlans(int page_size, absl::string_view page_token) = 0;

  // Durable (committed, fsynced) before it returns; returns the new id "meas-" + 16 hex.
  // NOT_FOUND for an unknown plan_id. measured_at_unix_ms (now) is set when 0.
  virtual absl::StatusOr<std::string> PutMeasurement(const memplan::v1::Measurement& m) = 0;
  // Same as PutMeasurement for many, all-or-nothing in one transaction (bulk import, tests).
  virtual absl::StatusOr<std::vector<std::string>> PutMeasurements(
      absl::Span<const memplan::v1::Measurement> measurements) = 0;
  virtual absl::StatusOr<int64_t> CountMeasurements() = 0;

  // Newest first (measured_at_unix_ms, then insertion), at most `limit` (> 0).
  virtual absl::StatusOr<std::vector<CalibrationSample>> RecentCalibrationSamples(
      const CalibrationKey& key, int limit) = 0;
  virtual absl::Status PutCalibrationSample(const CalibrationKey& key,
                                            const CalibrationSample& sample) = 0;
  // Inserts or replaces the calibration of its key (hardware_name, param_dtype, model_family,
  // method, optimizer).
  virtual absl::Status PutCalibration(const memplan::v1::Calibration& c) = 0;
  virtual absl::StatusOr<std::optional<memplan::v1::Calibration>> GetCalibration(
      const CalibrationKey& key) = 0;
  // Ordered by hardware_name, param_dtype, model_family.
  virtual absl::StatusOr<std::vector<memplan::v1::Calibration>> ListCalibrations(
      const CalibrationFilter& filter) = 0;
  // Calibration and sample rows carry a checksum; a row that does not match is skipped (logged,
  // counted in corrupt_rows_skipped), never returned.

  // Checks the stored file without blocking writers (a separate read-only connection).
  // DATA_LOSS naming the file and the first problems; OK for kOff and in MemoryStore.
  virtual absl::Status CheckIntegrity(IntegrityCheck mode) = 0;
  virtual StoreCounters Counters() const = 0;
};

// Clock and id source shared by both implementations; defaults: system clock, random device.
struct StoreEnv {
  std::function<int64_t()> now_unix_ms;
  std::function<uint64_t()> random_uint64;
};

struct SqliteStoreOptions {
  // Database file; created when missing (parent folder must exist). An existing empty (0-byte)
  // file is refused: it is more likely a lost database than a new one.
  std::string path;
  IntegrityCheck integrity_check = IntegrityCheck::kQuick;  // at open; a failure refuses it
  PlanRetention plan_retention;
  int64_t max_list_page_bytes = kDefaultListPlansPageBytes;
  int64_t max_database_bytes = 0;  // writes past it fail RESOURCE_EXHAUSTED; 0 = no limit
  int busy_timeout_ms = 5000;
  // Opens an existing file for reading only (NOT_FOUND when missing): no migration, no retention,
  // no WAL switch; every write fails. The file must have this binary's schema version. For
  // readers beside a running planner (the `memplan` CLI's in-process answers).
  bool read_only = false;
  int64_t cache_size_bytes = 8 << 20;    // page cache per connection (SQLite's cache_size)
  int max_measurements_per_plan = 1000;  // GetPlan returns at most this many
  // Migrate up to this schema version only (0 = latest). For tests of old files.
  int migrate_to_version = 0;
  StoreEnv env;
};

struct MemoryStoreOptions {
  int max_measurements_per_plan = 1000;
  PlanRetention plan_retention;
  int64_t max_list_page_bytes = kDefaultListPlansPageBytes;
  StoreEnv env;
};

// Opens (creating and migrating) the database. FAILED_PRECONDITION when the file's schema is
// newer than this binary knows, when it is empty, or when it belongs to another application;
// DATA_LOSS when the integrity check fails; RESOURCE_EXHAUSTED when the disk is full;
// INTERNAL/UNAVAILABLE for other SQLite errors. Messages name the file and what to do.
absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options);
// The latest schema version this binary writes (PRAGMA user_version).
int SqliteStoreSchemaVersion();
// "3.40.1": the SQLite library the store runs on (sqlite3_libversion), for `memplan env`; the
// header's version is added when it differs.
std::string StoreVersionText();

std::unique_ptr<Store> NewMemoryStore();
std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options);

}  // namespace memplan
