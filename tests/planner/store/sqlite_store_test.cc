// SqliteStore-specific properties: durability across reopen and kill -9, pragmas, schema
// migrations, refusal of newer schemas, and 100 000 measurements within the memory budget.
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/store/store.h"

namespace memplan {
namespace {

namespace v1 = memplan::v1;
using ::testing::HasSubstr;

// Direct access to the file, to inspect what the store wrote or to fake an old/new binary.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
  }
  ~RawDb() { sqlite3_close(db_); }
  std::string Text(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    std::string out;
    if (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, 0);
      if (text != nullptr) out = reinterpret_cast<const char*>(text);
    }
    sqlite3_finalize(stmt);
    return out;
  }
  std::set<std::string> Column(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    std::set<std::string> out;
    while (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
      out.insert(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)));
    }
    sqlite3_finalize(stmt);
    return out;
  }
  int ExecRc(const std::string& sql) {
    return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  }
  void Exec(const std::string& sql) {
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }

 private:
  sqlite3* db_ = nullptr;
};

class SqliteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "sqlite_store_test.XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
    path_ = dir_ + "/planner.db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  SqliteStoreOptions Options() const {
    SqliteStoreOptions options;
    options.path = path_;
    return options;
  }
  std::unique_ptr<Store> Open(SqliteStoreOptions options) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::unique_ptr<Store> Open() { return Open(Options()); }

  static std::string AddPlan(Store& store) {
    absl::StatusOr<std::string> id = store.PutPlan(v1::StoredPlan());
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }
  static v1::Measurement MeasurementFor(const std::string& plan_id, int64_t reserved_bytes) {
    v1::Measurement m;
    m.set_plan_id(plan_id);
    m.set_peak_reserved_bytes(reserved_bytes);
    m.set_step_seconds(0.5);
    return m;
  }

  // Calibration sample rows as binaries before schema version 4 wrote them (this binary's
  // store writes the newer columns); `values` is an SQL VALUES list.
  void InsertSamplesAsBefore(const std::string& values) {
    RawDb raw(path_);
    raw.Exec("INSERT INTO calibration_samples (hardware_name, param_dtype, model_family, "
             "raw_model_bytes, fixed_bytes, measured_bytes, measured_at_unix_ms, oom) VALUES " +
             values);
  }

  std::string dir_;
  std::string path_;
};

TEST_F(SqliteStoreTest, OpensWithDurablePragmasAndLatestSchema) {
  { ASSERT_NE(Open(), nullptr); }
  RawDb raw(path_);
  EXPECT_EQ(raw.Text("PRAGMA journal_mode"), "wal");  // persistent in the file
  EXPECT_EQ(raw.Text("PRAGMA user_version"), std::to_string(SqliteStoreSchemaVersion()));
  EXPECT_EQ(raw.Column("SELECT name FROM sqlite_master WHERE type = 'table'"),
            (std::set<std::string>{"calibration", "calibration_samples", "hardware_profiles",
                                   "measurements", "plans", "traces"}));
}

TEST_F(SqliteStoreTest, DataSurvivesReopen) {
  std::string plan;
  std::string trace_id;
  {
    std::unique_ptr<Store> store = Open();
    ASSERT_NE(store, nullptr);
    plan = AddPlan(*store);
    ASSERT_TRUE(store->PutMeasurement(MeasurementFor(plan, 7)).ok());
    v1::Trace trace;
    trace.set_hardware_name("H200");
    absl::StatusOr<std::string> id = store->PutTrace(trace);
    ASSERT_TRUE(id.ok());
    trace_id = *id;
    ASSERT_TRUE(
        store->PutCalibrationSample({"H200", DType::kBFloat16, "llama"}, {1, 2, 3, 4, false}).ok());
  }
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<v1::StoredPlan> got = store->GetPlan(plan);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->measurements_size(), 1);
  EXPECT_EQ(got->measurements(0).peak_reserved_bytes(), 7);
  EXPECT_TRUE(store->GetTrace(trace_id).ok());
  absl::StatusOr<std::vector<CalibrationSample>> samples =
      store->RecentCalibrationSamples({"H200", DType::kBFloat16, "llama"}, 5);
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 1u);
  EXPECT_EQ((*samples)[0].measured_bytes, 3);
}

TEST_F(SqliteStoreTest, MigratesAnOldVersionFileKeepingItsData) {
  SqliteStoreOptions old_binary = Options();
  old_binary.migrate_to_version = 1;  // what the first release wrote
  std::string plan;
  {
    std::unique_ptr<Store> store = Open(old_binary);
    ASSERT_NE(store, nullptr);
    plan = AddPlan(*store);
    ASSERT_TRUE(store->PutMeasurement(MeasurementFor(plan, 11)).ok());
    // The old schema has no samples table: the call fails cleanly, it does not crash.
    EXPECT_FALSE(store->PutCalibrationSample({"H200", DType::kBFloat16, "llama"}, {}).ok());
  }
  {
    RawDb raw(path_);
    EXPECT_EQ(raw.Text("PRAGMA user_version"), "1");
    EXPECT_EQ(raw.Text("SELECT COUNT(*) FROM sqlite_master WHERE name = 'calibration_samples'"),
              "0");
  }
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<v1::StoredPlan> got = store->GetPlan(plan);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->measurements_size(), 1);
  EXPECT_EQ(got->measurements(0).peak_reserved_bytes(), 11);
  EXPECT_TRUE(
      store->PutCalibrationSample({"H200", DType::kBFloat16, "llama"}, {1, 1, 1, 1, false}).ok());
  RawDb raw(path_);
  EXPECT_EQ(raw.Text("PRAGMA user_version"), std::to_string(SqliteStoreSchemaVersion()));
}

TEST_F(SqliteStoreTest, Version3MovesStoredSamplesToDeviceLevelBytes) {
  SqliteStoreOptions v2 = Options();
  v2.migrate_to_version = 2;  // samples held allocator-reserved bytes only
  const CalibrationKey key{"H200", DType::kBFloat16, "llama"};
  { ASSERT_NE(Open(v2), nullptr); }
  InsertSamplesAsBefore(
      "('H200', 2, 'llama', 100, 7, 120, 1, 0), ('H200', 2, 'llama', 100, 7, 90, 2, 1)");
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<CalibrationSample>> samples = store->RecentCalibrationSamples(key, 5);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  std::set<int64_t> measured;
  for (const CalibrationSample& s : *samples) measured.insert(s.measured_bytes);
  EXPECT_EQ(measured, (std::set<int64_t>{127, 97}));
  RawDb raw(path_);
  EXPECT_EQ(raw.Text("PRAGMA user_version"), std::to_string(SqliteStoreSchemaVersion()));
}

TEST_F(SqliteStoreTest, SampleStepTimesRoundTripAndOlderSamplesReadAsUnknown) {
  SqliteStoreOptions v3 = Options();
  v3.migrate_to_version = 3;  // before step times
  const CalibrationKey key{"H200", DType::kBFloat16, "llama"};
  { ASSERT_NE(Open(v3), nullptr); }
  InsertSamplesAsBefore("('H200', 2, 'llama', 100, 7, 120, 1, 0)");
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  CalibrationSample timed{100, 7, 130, 2, false};
  timed.predicted_seconds = 0.25;
  timed.measured_seconds = 0.3125;
  ASSERT_TRUE(store->PutCalibrationSample(key, timed).ok());
  absl::StatusOr<std::vector<CalibrationSample>> samples = store->RecentCalibrationSamples(key, 5);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_EQ((*samples)[0].predicted_seconds, 0.25);  // newest first
  EXPECT_EQ((*samples)[0].measured_seconds, 0.3125);
  EXPECT_EQ((*samples)[1].predicted_seconds, 0);
  EXPECT_EQ((*samples)[1].measured_seconds, 0);
}

TEST_F(SqliteStoreTest, RefusesASchemaNewerThanItKnows) {
  { ASSERT_NE(Open(), nullptr); }
  {
    RawDb raw(path_);
    raw.Exec("PRAGMA user_version = 99");
  }
  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(Options());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("99"));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("newer"));
}

TEST_F(SqliteStoreTest, ReportsAFileThatIsNotADatabase) {
  std::ofstream(path_) << std::string(8192, 'x');
  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(Options());
  EXPECT_TRUE(absl::IsDataLoss(store.status())) << store.status();
  SqliteStoreOptions no_path;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenSqliteStore(no_path).status()));
}

TEST_F(SqliteStoreTest, ForeignKeyProtectsMeasurements) {
  { ASSERT_NE(Open(), nullptr); }
  // Even a writer that bypasses the store's own check cannot orphan a measurement.
  RawDb raw(path_);
  raw.Exec("PRAGMA foreign_keys = ON");
  const int rc = raw.ExecRc(
      "INSERT INTO measurements (measurement_id, plan_id, measured_at_unix_ms, body) "
      "VALUES ('m', 'no-such-plan', 1, x'')");
  EXPECT_EQ(rc & 0xff, SQLITE_CONSTRAINT);
}

// [Durability] in sqlite_store.cc: a child process acknowledges measurements one by one through
// a pipe and is SIGKILLed at a random point; every acknowledged id must be in the file.
TEST_F(SqliteStoreTest, AcknowledgedMeasurementsSurviveKill9) {
  std::string plan;
  {
    std::unique_ptr<Store> store = Open();
    ASSERT_NE(store, nullptr);
    plan = AddPlan(*store);
  }
  std::random_device device;
  const unsigned seed = device();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::set<std::string> acknowledged;
  for (int round = 0; round < 3; ++round) {
    const int kill_after = std::uniform_int_distribution<int>(1, 60)(rng);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(fds[0]);
      SqliteStoreOptions options;
      options.path = path_;
      absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(options);
      if (!store.ok()) _exit(2);
      for (int i = 0; i < 100000; ++i) {
        absl::StatusOr<std::string> id = (*store)->PutMeasurement(MeasurementFor(plan, i));
        if (!id.ok()) _exit(3);
        const std::string line = *id + "\n";
        if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(4);
      }
      _exit(0);
    }
    close(fds[1]);
    std::string buffer;
    char chunk[256];
    int lines = 0;
    bool killed = false;
    while (true) {
      const ssize_t n = read(fds[0], chunk, sizeof(chunk));
      if (n <= 0) break;  // EOF once the child is dead and the pipe drained
      buffer.append(chunk, n);
      size_t newline;
      while ((newline = buffer.find('\n')) != std::string::npos) {
        acknowledged.insert(buffer.substr(0, newline));
        buffer.erase(0, newline + 1);
        ++lines;
      }
      if (!killed && lines >= kill_after) {
        ASSERT_EQ(kill(child, SIGKILL), 0);
        killed = true;
      }
    }
    close(fds[0]);
    int wstatus = 0;
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "child exited on its own with " << wstatus;
  }
  ASSERT_FALSE(acknowledged.empty());

  std::unique_ptr<Store> store = Open();  // recovers the WAL left by the killed writer
  ASSERT_NE(store, nullptr);
  RawDb raw(path_);
  const std::set<std::string> stored = raw.Column("SELECT measurement_id FROM measurements");
  for (const std::string& id : acknowledged) EXPECT_TRUE(stored.contains(id)) << id;
  absl::StatusOr<int64_t> count = store->CountMeasurements();
  ASSERT_TRUE(count.ok());
  // At most one put per round was committed but not yet acknowledged when the kill landed.
  EXPECT_GE(*count, static_cast<int64_t>(acknowledged.size()));
  EXPECT_LE(*count, static_cast<int64_t>(acknowledged.size()) + 3);
}

// ASan's shadow memory and quarantine inflate RSS several times; the budget is checked in
// normal builds only.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderSanitizer = true;
#else
constexpr bool kUnderSanitizer = false;
#endif
#else
constexpr bool kUnderSanitizer = false;
#endif

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// Issue 2: the planner stays under 200 MB RSS with 100 000 stored measurements. Inserts them in
// big transactions, then runs the queries the daemon serves; prints timings (not asserted).
TEST_F(SqliteStoreTest, HundredThousandMeasurementsStayWithinMemory) {
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  std::vector<std::string> plans;
  for (int i = 0; i < 100; ++i) plans.push_back(AddPlan(*store));

  constexpr int kTotal = 100000;
  constexpr int kBatch = 10000;
  const auto start = std::chrono::steady_clock::now();
  for (int done = 0; done < kTotal; done += kBatch) {
    std::vector<v1::Measurement> batch;
    batch.reserve(kBatch);
    for (int i = done; i < done + kBatch; ++i) {
      batch.push_back(MeasurementFor(plans[i % plans.size()], int64_t{40} << 30 | i));
    }
    absl::StatusOr<std::vector<std::string>> ids = store->PutMeasurements(batch);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_EQ(ids->size(), static_cast<size_t>(kBatch));
  }
  const double batch_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  constexpr int kSingles = 100;
  const auto single_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSingles; ++i) {
    ASSERT_TRUE(store->PutMeasurement(MeasurementFor(plans[0], i)).ok());
  }
  const double single_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - single_start).count();

  absl::StatusOr<int64_t> count = store->CountMeasurements();
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, kTotal + kSingles);
  absl::StatusOr<v1::StoredPlan> plan = store->GetPlan(plans[1]);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->measurements_size(), kTotal / 100);
  // Newest first: the last batch's measurement for plan 1 was number kTotal - 99.
  EXPECT_EQ(plan->measurements(0).peak_reserved_bytes(), int64_t{40} << 30 | (kTotal - 99));
  plan = store->GetPlan(plans[0]);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->measurements_size(), 1000);  // capped at max_measurements_per_plan
  absl::StatusOr<ListPlansPage> page = store->ListPlans(kMaxListPlansPageSize, "");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->plans.size(), plans.size());

  const int64_t peak_rss_bytes = PeakRssBytes();
  EXPECT_GT(peak_rss_bytes, 0);
  if (!kUnderSanitizer) {
    EXPECT_LT(peak_rss_bytes, int64_t{200} << 20);
  }
  std::cout << "[figures] 100000 measurements in 10 transactions: " << batch_seconds << " s ("
            << kTotal / batch_seconds
            << "/s); PutMeasurement one at a time (fsync each): " << kSingles / single_seconds
            << "/s; file " << std::filesystem::file_size(path_) / (1 << 20) << " MiB; peak RSS "
            << peak_rss_bytes / (1 << 20) << " MiB\n";
}

}  // namespace
}  // namespace memplan
