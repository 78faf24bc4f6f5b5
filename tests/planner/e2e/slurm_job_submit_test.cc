// deploy/slurm/job_submit.lua, the server-side half of the Slurm integration: its
// slurm_job_submit() is called by a Lua 5.4 interpreter with a stand-in for slurmctld's `slurm`
// table, as slurmctld's job_submit/lua plugin calls it. It only reads the plan tag that
// cli_filter.lua (tests/planner/e2e/slurm_cli_filter_test.cc) leaves, so no planner runs here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "daemon_process.h"

namespace memplan {
namespace {

using ::testing::HasSubstr;

constexpr char kStub[] = R"(slurm = { SUCCESS = 0, ERROR = -1 }
function slurm.log_user(fmt, ...) print("USER " .. string.format(fmt, ...)) end
function slurm.log_info(fmt, ...) print("INFO " .. string.format(fmt, ...)) end
-- Anything that would block slurmctld on a process or a file must not be reached.
io.popen = function() error("job_submit.lua started a process") end
os.execute = function() error("job_submit.lua started a process") end
dofile(arg[1])
local job = { comment = arg[2] ~= "" and arg[2] or nil }
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
    WriteConfig(false);
  }

  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void WriteConfig(bool require_plan) {
    std::ofstream(dir_ + "/site.lua")
        << "return { require_plan = " << (require_plan ? "true" : "false") << " }\n";
  }

  std::string Submit(const std::string& comment) {
    setenv("MEMPLAN_JOB_SUBMIT_CONFIG", (dir_ + "/site.lua").c_str(), 1);
    auto run = testing::RunToCompletion(
        MEMPLAN_LUA_BINARY,
        {dir_ + "/stub.lua", std::string(MEMPLAN_SOURCE_DIR) + "/deploy/slurm/job_submit.lua",
         comment});
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return "";
    EXPECT_TRUE(WIFEXITED(run->first) && WEXITSTATUS(run->first) == 0) << run->second;
    return run->second;
  }

  std::string dir_;
};

TEST_F(SlurmJobSubmitTest, APlannedJobIsLoggedWithItsPlanId) {
  const std::string comment = "memplan:model=llama-3.1-8b,plan=plan-0123456789abcdef";
  const std::string out = Submit(comment);
  EXPECT_THAT(out, HasSubstr("INFO memplan: job of uid 1000 planned by the cli_filter: "
                             "plan-0123456789abcdef"));
  EXPECT_THAT(out, HasSubstr("RC 0\nCOMMENT " + comment + "\n"));
}

TEST_F(SlurmJobSubmitTest, AnUnplannedJobPassesLoggedOrIsRefusedWhenAPlanIsRequired) {
  EXPECT_THAT(Submit("nightly build"), HasSubstr("RC 0\nCOMMENT nightly build"));
  std::string out = Submit("memplan:model=llama-3.1-8b");
  EXPECT_THAT(out, HasSubstr("RC 0"));
  EXPECT_THAT(out, HasSubstr("INFO memplan: job of uid 1000 passed unchecked"));
  WriteConfig(true);
  out = Submit("memplan:model=llama-3.1-8b");
  EXPECT_THAT(out, HasSubstr("RC -1"));
  EXPECT_THAT(out, HasSubstr("USER memplan: this job's comment asks for a memplan check but "
                             "carries no plan id"));
  EXPECT_THAT(out, HasSubstr("CliFilterPlugins=cli_filter/lua"));
  // A malformed tag is no plan id.
  EXPECT_THAT(Submit("memplan:model=llama-3.1-8b,plan=plan-12"), HasSubstr("RC -1"));
  EXPECT_THAT(Submit("nightly build"), HasSubstr("RC 0"));
}

}  // namespace
}  // namespace memplan
