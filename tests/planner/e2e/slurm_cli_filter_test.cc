// deploy/slurm/cli_filter.lua against the real planner and the real memplan CLI: its
// slurm_cli_pre_submit() is called by a Lua 5.4 interpreter with a stand-in for the `slurm` table
// (SUCCESS, ERROR, log_error, log_info) and an options table, as sbatch's cli_filter/lua plugin
// calls it. The CLI's JSON is read by lua-cjson. sbatch and slurmctld themselves do not run here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon_process.h"

#ifndef MEMPLAN_PLANNER_BINARY
#error "MEMPLAN_PLANNER_BINARY must name the memplan-planner executable"
#endif

namespace memplan {
namespace {

using ::memplan::testing::DaemonProcess;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

constexpr char kStub[] = R"(slurm = { SUCCESS = 0, ERROR = -1 }
function slurm.log_error(fmt, ...) print("ERROR " .. string.format(fmt, ...)) end
function slurm.log_info(fmt, ...) print("INFO " .. string.format(fmt, ...)) end
dofile(arg[1])
local options = { comment = arg[2] ~= "" and arg[2] or nil,
                  partition = arg[3] ~= "" and arg[3] or nil }
print("RC " .. slurm_cli_pre_submit(options, 0))
print("COMMENT " .. tostring(options.comment))
)";

class SlurmCliFilterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(MEMPLAN_LUA_BINARY)) {
      GTEST_SKIP() << MEMPLAN_LUA_BINARY << " is missing (apt-get install lua5.4 lua-cjson; "
                   << "scripts/bootstrap.sh does)";
    }
    std::string templ = ::testing::TempDir() + "/memplan-cli-filter-XXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    std::ofstream(dir_ + "/stub.lua") << kStub;
    auto daemon =
        DaemonProcess::Start(MEMPLAN_PLANNER_BINARY, dir_ + "/planner.db", dir_ + "/planner.log",
                             /*serve_metrics=*/false, {"--search-threads=2"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::make_unique<DaemonProcess>(*std::move(daemon));
    WriteConfig(daemon_->address());
  }

  void TearDown() override {
    daemon_.reset();
    if (dir_.empty()) return;
    if (HasFailure()) {
      std::printf("files kept in %s\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  void WriteConfig(const std::string& planner, bool fail_open = true) {
    std::ofstream(dir_ + "/site.lua") << "return { memplan = \"" << MEMPLAN_CLI_BINARY
                                      << "\", planner = \"" << planner
                                      << "\", timeout_seconds = " << MEMPLAN_SLURM_TIMEOUT_SECONDS
                                      << ", fail_open = " << (fail_open ? "true" : "false")
                                      << " }\n";
  }

  // Runs the filter on a job with this comment and partition; the interpreter's output.
  std::string Submit(const std::string& comment, const std::string& partition) {
    setenv("MEMPLAN_CLI_FILTER_CONFIG", (dir_ + "/site.lua").c_str(), 1);
    auto run = testing::RunToCompletion(
        MEMPLAN_LUA_BINARY,
        {dir_ + "/stub.lua", std::string(MEMPLAN_SOURCE_DIR) + "/deploy/slurm/cli_filter.lua",
         comment, partition});
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return "";
    EXPECT_TRUE(WIFEXITED(run->first) && WEXITSTATUS(run->first) == 0) << run->second;
    return run->second;
  }

  // The stored plan the filter's tag names, as `memplan --json plans get` prints it.
  std::string StoredPlan(const std::string& filter_output) {
    std::smatch match;
    static const std::regex kTag(",plan=(plan-[0-9a-f]{16})\n");
    if (!std::regex_search(filter_output, match, kTag)) {
      ADD_FAILURE() << "no plan tag in: " << filter_output;
      return "";
    }
    auto run = testing::RunToCompletion(
        MEMPLAN_CLI_BINARY,
        {"--planner", daemon_->address(), "--json", "plans", "get", match[1].str()});
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? run->second : "";
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(SlurmCliFilterTest, RefusesAFullFineTuneOnTheRtx4090PartitionAndTagsItOnH100) {
  std::string out = Submit("memplan:model=llama-3.1-8b,batch=1,seq=4096", "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("ERROR memplan: llama-3.1-8b on rtx-4090 (partition gpu-4090): "
                             "does not fit"));
  EXPECT_THAT(out, HasSubstr("COMMENT memplan:model=llama-3.1-8b,batch=1,seq=4096\n"));
  out = Submit("memplan:model=llama-3.1-8b,batch=1,seq=4096", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  EXPECT_THAT(out, MatchesRegex("(.|\n)*COMMENT memplan:model=llama-3.1-8b,batch=1,seq=4096,"
                                "plan=plan-[0-9a-f]{16}\n(.|\n)*"));
  EXPECT_THAT(StoredPlan(out), HasSubstr("\"micro_batch\": \"1\""));
}

TEST_F(SlurmCliFilterTest, MethodAndOptimizerReachThePlanner) {
  // LoRA fits the RTX 4090 (lora-rank alone means method=lora).
  std::string out =
      Submit("memplan:model=llama-3.1-8b,lora-rank=16,lora-targets=q_proj+v_proj", "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  std::string stored = StoredPlan(out);
  EXPECT_THAT(stored, HasSubstr("\"kind\": \"LORA\""));
  EXPECT_THAT(stored, MatchesRegex("(.|\n)*\"lora_target_modules\": \\[\\s*\"q_proj\",\\s*"
                                   "\"v_proj\"\\s*\\](.|\n)*"));
  // QLoRA with the 8-bit optimizer; underscores in keys are hyphens.
  out = Submit("memplan:model=llama-3.1-8b,method=qlora,lora_rank=16,lora_targets=all,"
               "optimizer=adamw8bit",
               "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  stored = StoredPlan(out);
  EXPECT_THAT(stored, HasSubstr("\"kind\": \"QLORA\""));
  EXPECT_THAT(stored, HasSubstr("\"lora_rank\": \"16\""));
  EXPECT_THAT(stored, HasSubstr("\"optimizer\": \"adamw8bit\""));
  EXPECT_THAT(stored, HasSubstr("\"down_proj\""));
  // A full fine-tune with SGD on the H100.
  out = Submit("memplan:model=llama-3.2-1b,method=full,optimizer=sgd,dtype=fp32", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  stored = StoredPlan(out);
  EXPECT_THAT(stored, HasSubstr("\"optimizer\": \"sgd\""));
  EXPECT_THAT(stored, HasSubstr("\"param_dtype\": \"DTYPE_FP32\""));
}

// The node's ranks and host memory override the partition's preset (memplan plan's node flags).
TEST_F(SlurmCliFilterTest, NodeKeysReachThePlanner) {
  std::string out = Submit(
      "memplan:model=llama-3.1-8b,world-size=2,gpus-per-node=2,host-memory-gib=512", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  const std::string stored = StoredPlan(out);
  EXPECT_THAT(stored, HasSubstr("\"local_world_size\": 2"));
  EXPECT_THAT(stored, HasSubstr("\"host_memory_bytes\": \"549755813888\""));  // 512 GiB
  out = Submit("memplan:model=llama-3.1-8b,host-memory-gib=lots", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("host-memory-gib='lots': expected a positive number"));
}

TEST_F(SlurmCliFilterTest, BadCommentsAreRefusedNamingTheKeyAndTheAllowedValues) {
  EXPECT_THAT(Submit("nightly build", "gpu-4090"), HasSubstr("RC 0\nCOMMENT nightly build"));
  std::string out = Submit("memplan:model=llama-3.1-8b;touch " + dir_ + "/owned", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("has characters other than letters, digits"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/owned")) << "the comment reached a shell";
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,gpus=8", "gpu-h100"),
              HasSubstr("ERROR memplan: --comment: unknown key 'gpus'; allowed: model, batch, "
                        "seq, world-size, grad-accum, dtype, method, lora-rank, lora-targets, "
                        "optimizer"));
  EXPECT_THAT(Submit("memplan:batch=2", "gpu-h100"), HasSubstr("model=PRESET is required"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,method=ia3", "gpu-h100"),
              HasSubstr("method='ia3': allowed: full, lora, qlora"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,optimizer=adam", "gpu-h100"),
              HasSubstr("optimizer='adam': allowed: adamw, adamw_bf16, adamw8bit, sgd"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,dtype=int8", "gpu-h100"),
              HasSubstr("dtype='int8': allowed: fp32, bf16, fp16"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,batch=two", "gpu-h100"),
              HasSubstr("batch='two': expected a positive integer"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,method=qlora", "gpu-h100"),
              HasSubstr("method=qlora needs lora-rank and lora-targets"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,method=lora,lora-rank=8", "gpu-h100"),
              HasSubstr("method=lora needs lora-rank and lora-targets"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,method=full,lora-rank=8", "gpu-h100"),
              HasSubstr("lora-rank and lora-targets need method=lora or method=qlora"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b", "cpu"),
              HasSubstr("partition 'cpu' has no GPU preset in cli_filter.lua; known: gpu-4090, "
                        "gpu-h100"));
  // Refused by the CLI or the planner: their message reaches the user.
  out = Submit("memplan:model=gpt-17", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("ERROR memplan: Plan failed: NOT_FOUND: arch_preset \"gpt-17\""));
  out = Submit("memplan:model=llama-3.1-8b,lora-rank=8,lora-targets=qproj", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("--lora-targets"));
}

TEST_F(SlurmCliFilterTest, AnUnreachablePlannerLetsJobsThroughAndPlannedJobsAreNotReplanned) {
  WriteConfig("127.0.0.1:1");
  std::string out = Submit("memplan:model=llama-3.1-8b", "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  EXPECT_THAT(out, HasSubstr("INFO memplan: job passed unchecked"));
  EXPECT_THAT(out, HasSubstr("cannot reach the planner at 127.0.0.1:1"));
  WriteConfig("127.0.0.1:1", /*fail_open=*/false);
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b", "gpu-4090"), HasSubstr("RC -1"));
  // A comment that already carries a plan (a step inheriting its job's) is not planned again.
  out = Submit("memplan:model=llama-3.1-8b,plan=plan-0123456789abcdef", "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC 0\nCOMMENT memplan:model=llama-3.1-8b,plan=plan-0123456789abcdef"));
  EXPECT_THAT(out, Not(HasSubstr("cannot reach")));
}

}  // namespace
}  // namespace memplan
