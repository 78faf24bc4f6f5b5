// deploy/slurm/job_submit.lua against the real planner and the real memplan CLI: its
// slurm_job_submit() is called by a Lua 5.4 interpreter with a stand-in for slurmctld's `slurm`
// table (SUCCESS, ERROR, log_user, log_info), as slurmctld's job_submit/lua plugin calls it.
// slurmctld itself does not run here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <memory>
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

constexpr char kStub[] = R"(slurm = { SUCCESS = 0, ERROR = -1 }
function slurm.log_user(fmt, ...) print("USER " .. string.format(fmt, ...)) end
function slurm.log_info(fmt, ...) print("INFO " .. string.format(fmt, ...)) end
dofile(arg[1])
local job = { comment = arg[2], partition = arg[3] ~= "" and arg[3] or nil }
print("RC " .. slurm_job_submit(job, {}, 1000))
print("COMMENT " .. tostring(job.comment))
)";

class SlurmJobSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(MEMPLAN_LUA_BINARY)) {
      GTEST_SKIP() << MEMPLAN_LUA_BINARY << " is missing (apt-get install lua5.4; "
                   << "scripts/bootstrap.sh does)";
    }
    std::string templ = ::testing::TempDir() + "/memplan-slurm-XXXXXX";
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

  void WriteConfig(const std::string& planner) {
    std::ofstream(dir_ + "/site.lua") << "return { memplan = \"" << MEMPLAN_CLI_BINARY
                                      << "\", planner = \"" << planner
                                      << "\", timeout_seconds = " << MEMPLAN_SLURM_TIMEOUT_SECONDS
                                      << " }\n";
  }

  // Submits a job with this comment to this partition; the interpreter's output.
  std::string Submit(const std::string& comment, const std::string& partition) {
    setenv("MEMPLAN_JOB_SUBMIT_CONFIG", (dir_ + "/site.lua").c_str(), 1);
    auto run = testing::RunToCompletion(
        MEMPLAN_LUA_BINARY,
        {dir_ + "/stub.lua", std::string(MEMPLAN_SOURCE_DIR) + "/deploy/slurm/job_submit.lua",
         comment, partition});
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return "";
    EXPECT_TRUE(WIFEXITED(run->first) && WEXITSTATUS(run->first) == 0) << run->second;
    return run->second;
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(SlurmJobSubmitTest, RefusesAFullFineTuneOnTheRtx4090PartitionAndTagsItOnH100) {
  std::string out = Submit("memplan:model=llama-3.1-8b,batch=1,seq=4096", "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("USER memplan: llama-3.1-8b on rtx-4090 (partition gpu-4090): "
                             "does not fit"));
  out = Submit("memplan:model=llama-3.1-8b,batch=1,seq=4096", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  EXPECT_THAT(out, MatchesRegex("(.|\n)*COMMENT memplan:model=llama-3.1-8b,batch=1,seq=4096,"
                                "plan=plan-[0-9a-f]{16}\n(.|\n)*"));
  // LoRA fits the RTX 4090.
  out = Submit("memplan:model=llama-3.1-8b,lora-rank=16,lora-targets=q_proj+v_proj", "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC 0"));
}

TEST_F(SlurmJobSubmitTest, OtherJobsPassAndBadCommentsAreNamed) {
  EXPECT_THAT(Submit("nightly build", "gpu-4090"), HasSubstr("RC 0\nCOMMENT nightly build"));
  std::string out = Submit("memplan:model=llama-3.1-8b;touch " + dir_ + "/owned", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("has characters other than letters, digits"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/owned")) << "the comment reached a shell";
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,gpus=8", "gpu-h100"),
              HasSubstr("unknown key 'gpus'; allowed: model, batch, seq"));
  EXPECT_THAT(Submit("memplan:batch=2", "gpu-h100"), HasSubstr("model=PRESET is required"));
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b", "cpu"),
              HasSubstr("partition 'cpu' has no GPU preset in job_submit.lua; known: gpu-4090, "
                        "gpu-h100"));
  out = Submit("memplan:model=gpt-17", "gpu-h100");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("USER memplan: Plan failed: NOT_FOUND: arch_preset \"gpt-17\""));
}

TEST_F(SlurmJobSubmitTest, AnUnreachablePlannerLetsJobsThrough) {
  WriteConfig("127.0.0.1:1");
  const std::string out = Submit("memplan:model=llama-3.1-8b", "gpu-4090");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  EXPECT_THAT(out, HasSubstr("INFO memplan: job of uid 1000 passed unchecked"));
  EXPECT_THAT(out, HasSubstr("cannot reach the planner at 127.0.0.1:1"));
}

}  // namespace
}  // namespace memplan
