// IntegrityMonitor over a real SQLite file that is garbled while the store has it open.
#include "planner/store/integrity_monitor.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

namespace v1 = memplan::v1;
using ::testing::HasSubstr;

class IntegrityMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "integrity_monitor_test.XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
    options_.path = dir_ + "/planner.db";
    {
      absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(options_);
      ASSERT_TRUE(store.ok()) << store.status();
      v1::StoredPlan plan;
      plan.mutable_request()->mutable_arch()->set_name(std::string(2000, 'p'));
      for (int i = 0; i < 40; ++i) ASSERT_TRUE((*store)->PutPlan(plan).ok());
    }  // closing moves the WAL into the file
    absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(options_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // 4 KiB of 0x7f over the middle page, behind the open store's back.
  void GarbleMiddlePage() {
    const uintmax_t bytes = std::filesystem::file_size(options_.path);
    std::fstream file(options_.path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(bytes / 4096 / 2 * 4096));
    const std::string garbage(4096, '\x7f');
    file.write(garbage.data(), garbage.size());
    ASSERT_TRUE(file.good());
  }

  std::string dir_;
  SqliteStoreOptions options_;
  std::unique_ptr<Store> store_;
};

TEST_F(IntegrityMonitorTest, ReportsAFailedCheckAndNothingElse) {
  std::atomic<int> failures{0};
  absl::Status reported;
  IntegrityMonitor::Options options;
  options.interval_seconds = 0;  // RunOnce only
  IntegrityMonitor monitor(*store_, options, [&](const absl::Status& status) {
    ++failures;
    reported = status;
  });
  EXPECT_TRUE(monitor.RunOnce().ok());
  EXPECT_EQ(failures.load(), 0);
  GarbleMiddlePage();
  const absl::Status status = monitor.RunOnce();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_EQ(failures.load(), 1);
  EXPECT_THAT(std::string(reported.message()), HasSubstr(options_.path));
}

TEST_F(IntegrityMonitorTest, TheScheduledCheckFindsDamageWhileServing) {
  GarbleMiddlePage();
  absl::Notification failed;
  IntegrityMonitor::Options options;
  options.interval_seconds = 0.01;
  IntegrityMonitor monitor(*store_, options, [&](const absl::Status& status) {
    if (absl::IsDataLoss(status) && !failed.HasBeenNotified()) failed.Notify();
  });
  EXPECT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(60)));
}

TEST_F(IntegrityMonitorTest, FirstScheduledCheckIsOneIntervalAfterTheOpen) {
  GarbleMiddlePage();
  std::atomic<int> failures{0};
  IntegrityMonitor::Options options;
  options.interval_seconds = 24 * 3600;
  auto monitor = std::make_unique<IntegrityMonitor>(
      *store_, options, [&](const absl::Status&) { ++failures; });
  monitor.reset();  // stops at once rather than waiting out the day
  EXPECT_EQ(failures.load(), 0) << "the open checked the file; the schedule starts after it";
}

}  // namespace
}  // namespace memplan
