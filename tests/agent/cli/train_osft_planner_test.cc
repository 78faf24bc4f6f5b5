// `memplan-agent train --planner ADDR --osft-rank-ratio R`: the real agent asks the real planner
// (loopback, a real SQLite file) for an OSFT plan ([OSFT plans], planner/core/osft_plan.h),
// trains llama-tiny on the CPU under it, unmanaged, with the block modes it answered.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class TrainOsftPlannerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string base =
        absl::StrCat(::testing::TempDir(), "/train_osft_planner_test_", getpid(), "_", counter_++);
    db_path_ = base + ".db";
    log_path_ = base + ".log";
    auto daemon = testing::DaemonProcess::Start(MEMPLAN_PLANNER_BINARY, db_path_, log_path_,
                                                /*serve_metrics=*/false);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_.emplace(*std::move(daemon));
  }
  void TearDown() override {
    daemon_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) std::remove((db_path_ + suffix).c_str());
    std::remove(log_path_.c_str());
  }

  std::pair<int, std::string> Train(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train",
                                     "--planner",
                                     daemon_->address(),
                                     "--arch",
                                     "llama-tiny",
                                     "--synthetic-data",
                                     "--steps",
                                     "2",
                                     "--batch",
                                     "1",
                                     "--seq",
                                     "32",
                                     "--device",
                                     "cpu",
                                     "--planner-retries",
                                     "0",
                                     "--osft-rank-ratio",
                                     "0.5"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto run = testing::RunToCompletion(MEMPLAN_AGENT_BINARY, args);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return {-1, ""};
    return *run;
  }

  static inline int counter_ = 0;
  std::string db_path_;
  std::string log_path_;
  std::optional<testing::DaemonProcess> daemon_;
};

TEST_F(TrainOsftPlannerTest, TrainsUnmanagedUnderThePlannersOsftPlan) {
  const auto [status, output] = Train({});
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_THAT(output, HasSubstr("fits=true"));
  EXPECT_THAT(output, HasSubstr("chunk_bytes=0"));
  EXPECT_THAT(output, HasSubstr("trained 2 steps"));
  // The split ran (the run is OSFT) and nothing was managed: no chunk layout to check.
  EXPECT_THAT(output, HasSubstr("osft_rank_ratio=0.5"));
  EXPECT_THAT(output, HasSubstr("osft_trainable_params="));
  EXPECT_THAT(output, Not(HasSubstr("plan layout matches")));
}

TEST_F(TrainOsftPlannerTest, CheckpointCountIsFixedInTheSearchAndApplied) {
  const auto [status, output] = Train({"--n-ckpt", "1"});
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_THAT(output, HasSubstr("n_ckpt=1"));
  EXPECT_THAT(output, HasSubstr("trained 2 steps"));
}

}  // namespace
}  // namespace memplan
