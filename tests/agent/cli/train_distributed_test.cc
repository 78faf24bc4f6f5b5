// `memplan-agent train` under torchrun's variables: two real processes on 127.0.0.1 (Gloo, CPU)
// train llama-tiny with --batch 2 each; one process with --batch 4 reads the same samples (the
// batcher gives rank r rows [2r, 2r + 2) of each global batch of 4). The per-step losses agree up
// to fp32 summation order; only rank 0 logs steps.
#include <sys/wait.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/subprocess.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

// The loss of every `msg="step"` log line, in order.
std::vector<double> StepLosses(const std::string& log) {
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.find("msg=\"step\"") == absl::string_view::npos) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      double v = 0;
      if (absl::ConsumePrefix(&field, "loss=") && absl::SimpleAtod(field, &v)) losses.push_back(v);
    }
  }
  return losses;
}

std::vector<std::string> TrainArgs(int batch) {
  return {MEMPLAN_AGENT_BINARY, "train", "--arch", "llama-tiny", "--synthetic-data", "--device",
          "cpu", "--batch", std::to_string(batch), "--seq", "32", "--steps", "3", "--lr", "1e-3",
          "--clip", "1.0", "--chunk-mib", "4", "--n-persist", "1", "--n-ckpt", "2",
          "--host-memory", "pageable", "--cpu-threads", "1"};
}

struct Exit {
  int status = 0;
  std::string err;
};

Exit Wait(const testing::Child& child) {
  Exit r;
  EXPECT_EQ(waitpid(child.pid, &r.status, 0), child.pid);
  r.err = testing::ReadFile(child.err_path);
  std::remove(child.out_path.c_str());
  std::remove(child.err_path.c_str());
  return r;
}

TEST(TrainDistributedTest, TwoRanksTrainLikeOneProcessOnTheWholeBatch) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_", getpid());
  const Exit single = Wait(testing::Spawn(TrainArgs(4), {}, base + ".single"));
  ASSERT_TRUE(WIFEXITED(single.status) && WEXITSTATUS(single.status) == 0) << single.err;
  const std::vector<double> expected = StepLosses(single.err);
  ASSERT_EQ(expected.size(), 3u) << single.err;

  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::vector<testing::Child> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(testing::Spawn(
        TrainArgs(2),
        {"WORLD_SIZE=2", absl::StrCat("RANK=", r), absl::StrCat("LOCAL_RANK=", r),
         "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)},
        absl::StrCat(base, ".rank", r)));
    ASSERT_GT(ranks.back().pid, 0);
  }
  const Exit rank0 = Wait(ranks[0]);
  const Exit rank1 = Wait(ranks[1]);
  if (absl::StrContains(rank0.err, "no Gloo process group")) GTEST_SKIP() << rank0.err;
  ASSERT_TRUE(WIFEXITED(rank0.status) && WEXITSTATUS(rank0.status) == 0) << rank0.err;
  ASSERT_TRUE(WIFEXITED(rank1.status) && WEXITSTATUS(rank1.status) == 0) << rank1.err;
  EXPECT_THAT(rank0.err, HasSubstr("msg=\"joined the process group\" rank=0 world_size=2"));
  EXPECT_THAT(rank0.err, HasSubstr("world_size=2"));
  const std::vector<double> got = StepLosses(rank0.err);
  ASSERT_EQ(got.size(), 3u) << rank0.err;
  EXPECT_TRUE(StepLosses(rank1.err).empty()) << "rank 1 logged steps:\n" << rank1.err;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], 1e-4 * std::abs(expected[i])) << "step " << i + 1;
  }
  // The loss moved: a run that did not train would also "agree".
  EXPECT_GT(std::abs(expected[2] - expected[0]), 1e-3);
}

TEST(TrainDistributedTest, WhatSeveralRanksDoNotRunYetIsRefusedNamingTheFlag) {
  const std::string base = absl::StrCat(::testing::TempDir(), "/train_distributed_bad_", getpid());
  std::vector<std::string> args = TrainArgs(2);
  args.push_back("--save");
  args.push_back(base + ".ckpt");
  const Exit run = Wait(testing::Spawn(
      args, {"WORLD_SIZE=2", "RANK=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1"}, base));
  ASSERT_TRUE(WIFEXITED(run.status));
  EXPECT_EQ(WEXITSTATUS(run.status), 1);
  EXPECT_THAT(run.err, HasSubstr("rank 1: UNIMPLEMENTED: --save is not supported with world size 2"));
  const Exit bad_env = Wait(testing::Spawn(TrainArgs(2), {"WORLD_SIZE=2"}, base + ".env"));
  ASSERT_TRUE(WIFEXITED(bad_env.status));
  EXPECT_EQ(WEXITSTATUS(bad_env.status), 2);
  EXPECT_THAT(bad_env.err, HasSubstr("RANK (environment) is required with WORLD_SIZE 2"));
}

}  // namespace
}  // namespace memplan
