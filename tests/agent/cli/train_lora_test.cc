// `memplan-agent train --lora-*`: a LoRA run with dropout saved and resumed equals one that never
// stopped (the adapter files byte for byte), a LoRA checkpoint resumes without the LoRA flags, and bad LoRA
// flags fail naming the flag and the allowed range; two ranks train LoRA and QLoRA like one
// process, QLoRA also with a plan that shards the persistent base chunks.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent/subprocess.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

struct Exit {
  int code = -1;
  std::string err;
};

Exit RunAgent(const std::vector<std::string>& args, const std::string& base) {
  const testing::Child child = testing::Spawn(args, {}, base);
  int status = 0;
  EXPECT_EQ(waitpid(child.pid, &status, 0), child.pid);
  Exit e;
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  e.err = testing::ReadFile(child.err_path) + testing::ReadFile(child.out_path);
  std::remove(child.out_path.c_str());
  std::remove(child.err_path.c_str());
  return e;
}

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

std::vector<std::string> LoraArgs(const std::string& data, int steps) {
  return {MEMPLAN_AGENT_BINARY,
          "train",
          "--arch",
          "llama-tiny",
          "--device",
          "cpu",
          "--data",
          data,
          "--batch",
          "2",
          "--seq",
          "32",
          "--steps",
          std::to_string(steps),
          "--lr",
          "1e-2",
          "--lora-rank",
          "4",
          "--lora-alpha",
          "8",
          "--lora-dropout",
          "0.1",
          "--lora-targets",
          "q_proj,v_proj,down_proj",
          "--chunk-mib",
          "1",
          "--n-persist",
          "1",
          "--n-ckpt",
          "1",
          "--host-memory",
          "pageable",
          "--cpu-threads",
          "1"};
}

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

class TrainLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = absl::StrCat(::testing::TempDir(), "/train_lora_", getpid());
    data_ = base_ + ".tokens";
    const Exit made = RunAgent(
        {MEMPLAN_MAKE_TOKENS_BINARY, "--out=" + data_, "--tokens=8192", "--vocab=2048", "--seed=5"},
        base_ + ".make");
    ASSERT_EQ(made.code, 0) << made.err;
  }
  // This binary does not link Torch, so std::filesystem is safe here.
  void TearDown() override {
    for (const char* suffix : {".straight", ".ckpt", ".resumed", ".tokens"}) {
      std::filesystem::remove_all(base_ + suffix);
    }
  }
  std::vector<double> ResumeEqualsStraight(const std::vector<std::string>& extra);
  std::string base_, data_;
};

// Four steps straight against two steps saved and resumed to four, with `extra` flags on every
// run: the same losses and the same adapter, byte for byte. Returns the straight run's losses.
std::vector<double> TrainLoraTest::ResumeEqualsStraight(const std::vector<std::string>& extra) {
  const Exit straight = RunAgent(
      With(With(LoraArgs(data_, 4), extra), {"--save-adapter", base_ + ".straight"}), base_ + ".s");
  EXPECT_EQ(straight.code, 0) << straight.err;
  const Exit first =
      RunAgent(With(With(LoraArgs(data_, 2), extra), {"--save", base_ + ".ckpt"}), base_ + ".f");
  EXPECT_EQ(first.code, 0) << first.err;
  const Exit second = RunAgent(With(With(LoraArgs(data_, 4), extra),
                                    {"--resume", base_ + ".ckpt", "--save-adapter",
                                     base_ + ".resumed"}),
                               base_ + ".r");
  EXPECT_EQ(second.code, 0) << second.err;
  const std::vector<double> all = StepLosses(straight.err);
  std::vector<double> parts = StepLosses(first.err);
  for (double l : StepLosses(second.err)) parts.push_back(l);
  EXPECT_EQ(all.size(), 4u);
  EXPECT_EQ(all, parts);
  const std::string want = testing::ReadFile(base_ + ".straight/adapter_model.safetensors");
  EXPECT_GT(want.size(), 1000u);
  EXPECT_TRUE(want == testing::ReadFile(base_ + ".resumed/adapter_model.safetensors"))
      << "the resumed run's adapter differs from the straight run's";
  return all;
}

TEST_F(TrainLoraTest, ResumedRunEqualsTheStraightOneByteForByte) {
  ResumeEqualsStraight({});
  EXPECT_THAT(testing::ReadFile(base_ + ".straight/adapter_config.json"),
              HasSubstr("\"peft_type\": \"LORA\""));

  // The checkpoint is a LoRA one: resumed without the LoRA flags it supplies them
  // ([LoRA resume settings]; tests/agent/cli/train_run_control_test.cc has the contradictions).
  const Exit bare =
      RunAgent({MEMPLAN_AGENT_BINARY, "train", "--arch", "llama-tiny", "--device", "cpu", "--data",
                data_, "--batch", "2", "--seq", "32", "--steps", "3", "--resume", base_ + ".ckpt"},
               base_ + ".bare");
  EXPECT_EQ(bare.code, 0) << bare.err;
  EXPECT_THAT(bare.err, HasSubstr("msg=\"LoRA settings from the checkpoint\""));
  EXPECT_THAT(bare.err, HasSubstr("rank=4 alpha=8 dropout=0.1"));
}

// QLoRA (--qlora): the NF4 base is quantized from the same initial values on every run, so a
// resumed run (adapters and their state from the checkpoint) equals the straight one; and the
// quantized base is not the bf16/fp32 one (the losses differ from LoRA's on the same data).
TEST_F(TrainLoraTest, QloraResumedRunEqualsTheStraightOne) {
  const Exit lora = RunAgent(LoraArgs(data_, 2), base_ + ".l");
  ASSERT_EQ(lora.code, 0) << lora.err;
  const std::vector<double> all = ResumeEqualsStraight({"--qlora"});
  ASSERT_EQ(all.size(), 4u);
  const std::vector<double> plain = StepLosses(lora.err);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_NE(plain[0], all[0]) << "the NF4 base computed what the unquantized one does";
  EXPECT_NEAR(plain[0], all[0], 0.05 * plain[0]) << "NF4 is a close copy of the base";
}

// LoraArgs for 3 steps with clipping and `batch` rows, LoRA or QLoRA, without dropout (ranks
// would draw other masks than one process on the whole batch).
std::vector<std::string> RankArgs(const std::string& data, int batch, bool qlora) {
  std::vector<std::string> a = With(LoraArgs(data, 3), {"--clip", "1"});
  if (qlora) a.push_back("--qlora");
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    if (a[i] == "--lora-dropout") a[i + 1] = "0";
    if (a[i] == "--batch") a[i + 1] = std::to_string(batch);
  }
  return a;
}

// Several ranks ([Sharded frozen base] in agent/chunks/chunk_manager.cc): two Gloo ranks with
// --batch 2 train LoRA (each rank drawing only its shares of the base) and QLoRA (each rank
// quantizing only its shares) like one process
// with --batch 4 (no dropout: the ranks would draw other masks than the one process), and rank 0
// writes the adapter and the merged export.
TEST_F(TrainLoraTest, TwoRanksTrainLikeOneProcessOnTheWholeBatch) {
  for (const bool qlora : {false, true}) {
    SCOPED_TRACE(qlora ? "qlora" : "lora");
    auto args = [&](int batch) { return RankArgs(data_, batch, qlora); };
    const Exit single = RunAgent(args(4), base_ + ".one");
    ASSERT_EQ(single.code, 0) << single.err;
    const std::vector<double> expected = StepLosses(single.err);
    ASSERT_EQ(expected.size(), 3u) << single.err;

    const int port = testing::FreeLoopbackPort();
    ASSERT_GT(port, 0);
    const std::vector<std::string> ranked = With(
        args(2), {"--save-adapter", base_ + ".straight", "--merge-export", base_ + ".resumed"});
    std::vector<testing::Child> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(testing::Spawn(
          ranked,
          {"WORLD_SIZE=2", absl::StrCat("RANK=", r), absl::StrCat("LOCAL_RANK=", r),
           "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)},
          absl::StrCat(base_, ".rank", r)));
      ASSERT_GT(ranks.back().pid, 0);
    }
    std::string err[2];
    for (int r = 0; r < 2; ++r) {
      int status = 0;
      EXPECT_EQ(waitpid(ranks[r].pid, &status, 0), ranks[r].pid);
      err[r] = testing::ReadFile(ranks[r].err_path) + testing::ReadFile(ranks[r].out_path);
      std::remove(ranks[r].out_path.c_str());
      std::remove(ranks[r].err_path.c_str());
      if (absl::StrContains(err[r], "no Gloo process group")) GTEST_SKIP() << err[r];
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << ":\n"
                                                                 << err[r];
    }
    const std::vector<double> got = StepLosses(err[0]);
    ASSERT_EQ(got.size(), 3u) << err[0];
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], expected[i], 1e-4 * std::abs(expected[i])) << "step " << i + 1;
    }
    EXPECT_NE(got[0], got[2]);
    for (int r = 0; r < 2; ++r) {
      // Each rank logged its share of the base, drawn into its shards (QLoRA: and quantized
      // there, [Sharded NF4 loading]).
      EXPECT_THAT(err[r], HasSubstr("base_chunk_host_bytes=")) << r;
      EXPECT_THAT(err[r], HasSubstr("sharded_load=1")) << r;
      if (qlora) {
        EXPECT_THAT(err[r], HasSubstr("msg=\"quantized base\" rank=")) << r;
      }
      // The rank figures count the base's gathers: LoRA's 17 offloaded chunks take turns in 5
      // buffers, so steps 2 and 3 gather again (QLoRA's 3 stay resident in theirs).
      EXPECT_THAT(err[r], HasSubstr(absl::StrCat("rank ", r, " chunk all-gathers (after step 1): ")));
      if (!qlora) {
        EXPECT_THAT(err[r], ::testing::Not(HasSubstr("chunk all-gathers (after step 1): 0,")))
            << r;
      }
    }
    EXPECT_THAT(testing::ReadFile(base_ + ".straight/adapter_config.json"),
                HasSubstr("\"peft_type\": \"LORA\""));
    EXPECT_GT(testing::ReadFile(base_ + ".straight/adapter_model.safetensors").size(), 1000u);
    EXPECT_GT(testing::ReadFile(base_ + ".resumed/model.safetensors").size(), 100000u);
    std::filesystem::remove_all(base_ + ".straight");
    std::filesystem::remove_all(base_ + ".resumed");
  }
}

// The integer `key=` of the first log line with msg="`msg`", or -1.
int64_t LogField(const std::string& log, const std::string& msg, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::StrContains(line, absl::StrCat("msg=\"", msg, "\""))) continue;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      int64_t v = 0;
      if (absl::ConsumePrefix(&field, key + "=") && absl::SimpleAtoi(field, &v)) return v;
    }
  }
  return -1;
}

// [Sharded frozen base] as the planner prices a LoRA / QLoRA run over several ranks: a plan with
// shard_persistent_params = true and shard_persistent_state = false (the base has no state, the
// adapters' stays replicated), read from a plan file as from the planner. Two Gloo ranks of
// QLoRA applying it train like one process on the whole batch, and each rank stores half of the
// persistent base chunk (a byte chunk: ceil(S / 2) of its S bytes), gathered per stage.
TEST_F(TrainLoraTest, QloraPlanShardingThePersistentBaseTrainsLikeOneProcess) {
  auto args = [&](int batch) { return RankArgs(data_, batch, /*qlora=*/true); };
  const Exit single = RunAgent(args(4), base_ + ".one");
  ASSERT_EQ(single.code, 0) << single.err;
  const std::vector<double> expected = StepLosses(single.err);
  ASSERT_EQ(expected.size(), 3u) << single.err;
  const int64_t whole = LogField(single.err, "plan applied", "persistent_device_bytes");
  ASSERT_GT(whole, 0) << single.err;

  const std::string plan = base_ + ".plan.json";
  {
    std::FILE* f = std::fopen(plan.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"({"plan": {"worldSize": 2, "shardPersistentState": false, )"
               R"("shardPersistentParams": true}})",
               f);
    std::fclose(f);
  }
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::vector<testing::Child> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(testing::Spawn(
        With(args(2), {"--plan-file", plan}),
        {"WORLD_SIZE=2", absl::StrCat("RANK=", r), absl::StrCat("LOCAL_RANK=", r),
         "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", absl::StrCat("MASTER_PORT=", port)},
        absl::StrCat(base_, ".prank", r)));
    ASSERT_GT(ranks.back().pid, 0);
  }
  std::string err[2];
  bool gloo = true;
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    EXPECT_EQ(waitpid(ranks[r].pid, &status, 0), ranks[r].pid);
    err[r] = testing::ReadFile(ranks[r].err_path) + testing::ReadFile(ranks[r].out_path);
    std::remove(ranks[r].out_path.c_str());
    std::remove(ranks[r].err_path.c_str());
    if (absl::StrContains(err[r], "no Gloo process group")) gloo = false;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << ":\n"
                                                               << err[r];
  }
  std::remove(plan.c_str());
  if (!gloo) GTEST_SKIP() << err[0];
  const std::vector<double> got = StepLosses(err[0]);
  ASSERT_EQ(got.size(), 3u) << err[0];
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], 1e-4 * std::abs(expected[i])) << "step " << i + 1;
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(LogField(err[r], "plan applied", "persistent_device_bytes"), (whole + 1) / 2)
        << err[r];
  }
  std::printf("losses %.6f %.6f %.6f (one process %.6f %.6f %.6f); persistent base %lld bytes, "
              "%lld per rank\n",
              got[0], got[1], got[2], expected[0], expected[1], expected[2],
              static_cast<long long>(whole),
              static_cast<long long>(LogField(err[0], "plan applied", "persistent_device_bytes")));
}

TEST_F(TrainLoraTest, BadFlagsNameTheFlagAndTheRange) {
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--lora-rank", "0", "--lora-targets", "all"}, "--lora-rank: 0 is outside [1, 65536]"},
      {{"--lora-rank", "4", "--lora-targets", "all", "--lora-dropout", "1"},
       "--lora-dropout: 1 is outside [0, 1)"},
      {{"--lora-rank", "4", "--lora-targets", "q_proj,qkv"},
       "--lora-targets: \"qkv\" is not one of q_proj"},
      {{"--lora-rank", "4"}, "--lora-rank: needs --lora-targets"},
      {{"--save-adapter", "x"}, "--save-adapter: needs --lora-rank"},
      {{"--qlora"}, "--qlora: needs --lora-rank"},
      {{"--qlora=1", "--lora-rank", "4", "--lora-targets", "all"}, "--qlora: takes no value"},
      {{"--lora-rank", "100000", "--lora-targets", "all"}, "--lora-rank: 100000 is outside"},
      {{"--lora-rank", "4096", "--lora-targets", "all"},
       "--lora-rank = 4096; allowed: 1 to hidden_size"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {MEMPLAN_AGENT_BINARY,
                                     "train",
                                     "--arch",
                                     "llama-tiny",
                                     "--device",
                                     "cpu",
                                     "--data",
                                     data_,
                                     "--steps",
                                     "1"};
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    const Exit e = RunAgent(args, base_ + ".bad");
    EXPECT_NE(e.code, 0) << c.message;
    EXPECT_THAT(e.err, HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace memplan
