// The real `memplan` binary against the real `memplan-planner` daemon (loopback, temporary SQLite
// file): what a user sees, including exit statuses. Binary paths come from CMake.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/planner/e2e/daemon_process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef MEMPLAN_PLANNER_BIN
#error "MEMPLAN_PLANNER_BIN must name the memplan-planner binary"
#endif
#ifndef MEMPLAN_CLI_BIN
#error "MEMPLAN_CLI_BIN must name the memplan binary"
#endif

namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Reads `fd` to EOF.
std::string ReadAll(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  return text;
}

std::vector<char*> Argv(const std::string& program, std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

// Runs `program args...` to completion (in `cwd` when not empty, with $PATH = `path_env` when not
// empty); stdout and stderr captured through temp files so that neither pipe can fill while the
// other is being read.
RunResult RunProgram(const std::string& program, std::vector<std::string> args,
                     const std::string& cwd = "", const std::string& path_env = "") {
  const std::string base = absl::StrCat(::testing::TempDir(), "memplan_cli_e2e_", ::getpid());
  const std::string out_path = base + ".out";
  const std::string err_path = base + ".err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    if (!path_env.empty()) ::setenv("PATH", path_env.c_str(), 1);
    std::vector<char*> argv = Argv(program, args);
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  RunResult result;
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const int out = ::open(out_path.c_str(), O_RDONLY);
  const int err = ::open(err_path.c_str(), O_RDONLY);
  result.out = ReadAll(out);
  result.err = ReadAll(err);
  ::close(out);
  ::close(err);
  ::unlink(out_path.c_str());
  ::unlink(err_path.c_str());
  return result;
}

// One daemon for the suite, on free ports with a fresh database.
class MemplanCliE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    db_path_ =
        new std::string(absl::StrCat(::testing::TempDir(), "memplan_cli_e2e_", ::getpid(), ".db"));
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    daemon_pid_ = ::fork();
    if (daemon_pid_ == 0) {
      ::dup2(pipe_fds[1], 1);
      ::close(pipe_fds[0]);
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 2);  // the daemon's logs
      std::vector<std::string> args = {"--listen=127.0.0.1:0",
                                       "--metrics=", absl::StrCat("--db=", *db_path_)};
      std::vector<char*> argv = Argv(MEMPLAN_PLANNER_BIN, args);
      ::execv(MEMPLAN_PLANNER_BIN, argv.data());
      ::_exit(127);
    }
    ::close(pipe_fds[1]);
    // The daemon prints "listening on HOST:PORT" once it is serving; read up to that line.
    std::string line;
    char c;
    while (::read(pipe_fds[0], &c, 1) == 1 && c != '\n') line += c;
    daemon_stdout_ = pipe_fds[0];
    const std::string prefix = "listening on ";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << "daemon said: " << line;
    address_ = new std::string(line.substr(prefix.size()));
  }

  static void TearDownTestSuite() {
    if (daemon_pid_ > 0) {
      ::kill(daemon_pid_, SIGTERM);
      int status = 0;
      ::waitpid(daemon_pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "daemon status " << status;
    }
    if (daemon_stdout_ >= 0) ::close(daemon_stdout_);
    if (db_path_ != nullptr) {
      for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((*db_path_ + suffix).c_str());
    }
    delete db_path_;
    delete address_;
  }

  void SetUp() override { ASSERT_NE(address_, nullptr) << "daemon did not start"; }

  static RunResult Memplan(std::vector<std::string> args) {
    args.insert(args.begin(), {"--planner", *address_});
    return RunProgram(MEMPLAN_CLI_BIN, std::move(args));
  }

  static pid_t daemon_pid_;
  static int daemon_stdout_;
  static std::string* address_;
  static std::string* db_path_;
};
pid_t MemplanCliE2eTest::daemon_pid_ = -1;
int MemplanCliE2eTest::daemon_stdout_ = -1;
std::string* MemplanCliE2eTest::address_ = nullptr;
std::string* MemplanCliE2eTest::db_path_ = nullptr;

TEST_F(MemplanCliE2eTest, PresetsListsModelsAndCards) {
  RunResult r = Memplan({"presets"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("llama-3.1-8b"));
  EXPECT_THAT(r.out, HasSubstr("qwen3-8b"));
  EXPECT_THAT(r.out, HasSubstr("h100-80gb"));
  EXPECT_THAT(r.out, HasSubstr("rtx-4090"));
}

TEST_F(MemplanCliE2eTest, PlanTableThenMeasureThenCalibrationThenStoredPlan) {
  RunResult plan = Memplan({"plan", "--arch", "llama-3.2-1b", "--gpu", "h100-80gb", "--seq", "2048",
                            "--skip-limits", "--max-alternatives", "2"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("Verdict           FITS"));
  EXPECT_THAT(plan.out, HasSubstr("Predicted peak"));
  EXPECT_THAT(plan.out, HasSubstr("optimizer state"));
  EXPECT_THAT(plan.out, MatchesRegex("(.|\n)*Blocks +[a-z_]+×[0-9]+(.|\n)*"));
  const size_t at = plan.out.find("plan-");
  ASSERT_NE(at, std::string::npos);
  const std::string plan_id = plan.out.substr(at, plan.out.find('\n', at) - at);

  // The step took 10 % longer than predicted (a time far from the plan's would be quarantined).
  const size_t time_at = plan.out.find("Time / iteration");
  ASSERT_NE(time_at, std::string::npos) << plan.out;
  double predicted_seconds = 0;
  char unit[3] = {};
  ASSERT_EQ(
      std::sscanf(plan.out.c_str() + time_at, "Time / iteration %lf %2s", &predicted_seconds, unit),
      2);
  if (std::string(unit) == "ms") predicted_seconds /= 1e3;
  RunResult measure =
      Memplan({"measure", "--plan-id", plan_id, "--peak-reserved", "20GiB", "--step-seconds",
               absl::StrCat(1.1 * predicted_seconds), "--note", "e2e"});
  ASSERT_EQ(measure.exit_code, 0) << measure.err;
  EXPECT_THAT(measure.out, HasSubstr("Prediction error"));
  EXPECT_THAT(measure.out, HasSubstr("h100-80gb"));
  EXPECT_THAT(measure.out, Not(HasSubstr("Quarantined")));

  // A peak the card cannot hold is stored, quarantined, and leaves the calibration alone.
  RunResult impossible = Memplan({"measure", "--plan-id", plan_id, "--peak-reserved", "200GiB"});
  ASSERT_EQ(impossible.exit_code, 0) << impossible.err;
  EXPECT_THAT(impossible.out, HasSubstr("Quarantined"));
  EXPECT_THAT(impossible.out, HasSubstr("peak_above_card: peak_reserved_bytes"));
  EXPECT_THAT(impossible.out, HasSubstr("Calibration (unchanged)"));

  RunResult calibration = Memplan({"calibration", "--hardware", "h100-80gb"});
  ASSERT_EQ(calibration.exit_code, 0) << calibration.err;
  EXPECT_THAT(calibration.out, HasSubstr("llama"));
  EXPECT_THAT(calibration.out, Not(HasSubstr("No calibration yet")));

  RunResult stored = Memplan({"plans", "get", plan_id});
  ASSERT_EQ(stored.exit_code, 0) << stored.err;
  EXPECT_THAT(stored.out, HasSubstr("llama-3.2-1b"));
  EXPECT_THAT(stored.out, HasSubstr("Measurements"));
  EXPECT_THAT(stored.out, HasSubstr("20.00"));
  EXPECT_THAT(stored.out, HasSubstr("e2e"));
  EXPECT_THAT(stored.out, HasSubstr("200.00"));
  EXPECT_THAT(stored.out, MatchesRegex("(.|\n)*#[12] quarantined: peak_above_card(.|\n)*"));

  RunResult list = Memplan({"plans", "list", "--all"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr(plan_id));
}

// Issue 12's admission example through the real binaries: a llama-3.1-8b full fine-tune is
// refused by an RTX 4090 pool and admitted on an H100 pool.
TEST_F(MemplanCliE2eTest, AdmitPicksThePoolThatFits) {
  RunResult table =
      Memplan({"admit", "--arch", "llama-3.1-8b", "--batch", "1", "--seq", "4096", "--skip-limits",
               "--pool", "consumer=rtx-4090:16", "--pool", "datacenter=h100-80gb:8"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, MatchesRegex("(.|\n)*consumer +rtx-4090 +16 +no fit(.|\n)*"));
  EXPECT_THAT(table.out, MatchesRegex("(.|\n)*datacenter +h100-80gb +8 +fits(.|\n)*"));
  EXPECT_THAT(table.out, HasSubstr("Best pool         datacenter"));
  EXPECT_THAT(table.out, HasSubstr("consumer: does not fit"));

  RunResult json = Memplan({"--json", "admit", "--arch", "llama-3.1-8b", "--skip-limits", "--pool",
                            "consumer=rtx-4090:16", "--pool", "datacenter=h100-80gb:8"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"best_pool\": \"datacenter\""));
  EXPECT_THAT(json.out, HasSubstr("\"job_tokens_per_second\""));

  RunResult unknown =
      Memplan({"admit", "--arch", "llama-3.1-8b", "--pool", "x=tpu-v9", "--skip-limits"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("Admit failed: NOT_FOUND: pools[0] (\"x\")"));
}

TEST_F(MemplanCliE2eTest, JsonOutputIsProtoJson) {
  RunResult r =
      Memplan({"--json", "plan", "--arch", "llama-tiny", "--gpu", "rtx-4090", "--skip-limits"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"fits\": true"));
  EXPECT_THAT(r.out, HasSubstr("\"plan_id\": \"plan-"));
  EXPECT_THAT(r.out, HasSubstr("\"block_modes\""));
}

TEST_F(MemplanCliE2eTest, PlannerErrorsExitOneWithCode) {
  RunResult unknown = Memplan({"plan", "--arch", "llama-9000", "--gpu", "h100-80gb"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("Plan failed: NOT_FOUND"));
  EXPECT_THAT(unknown.err, HasSubstr("llama-9000"));
  RunResult missing = Memplan({"plans", "get", "plan-0000000000000000"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("GetPlan failed: NOT_FOUND"));
}

TEST_F(MemplanCliE2eTest, UsageErrorsExitTwoAndHelpExitsZero) {
  RunResult bad = Memplan({"plan", "--arch", "llama-tiny", "--gpu", "h100-80gb", "--dtype", "fp8"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--dtype: \"fp8\" is not one of fp32, bf16, fp16"));
  RunResult help = RunProgram(MEMPLAN_CLI_BIN, {"plan", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("--arch-file"));
}

// A profiled trace of llama-tiny (4 layers) at 1 x 512 tokens, as an agent would submit it.
constexpr char kTinyTraceJson[] = R"({
  "arch": {"name": "llama-tiny", "family": "llama", "hidden_size": "256", "num_layers": "4",
           "num_heads": "8", "num_kv_heads": "4", "intermediate_size": "688",
           "vocab_size": "2048", "rope_theta": 500000, "rms_norm_eps": 1e-5,
           "max_position_embeddings": "131072"},
  "workload": {"micro_batch": "1", "seq_len": "512", "world_size": 1, "grad_accum": 1},
  "param_dtype": "DTYPE_BF16",
  "training": {"kind": "FULL"},
  "hardware_name": "h100-80gb",
  "analytic": false,
  "embedding": {"param_bytes": "1048576", "saved_bytes": "262144", "forward_seconds": 0.0001,
                "backward_seconds": 0.0002},
  "blocks": [
    {"param_bytes": "3227648", "input_bytes": "262144", "saved_bytes": "4194304",
     "forward_transient_bytes": "1048576", "backward_transient_bytes": "2097152",
     "forward_seconds": 0.0003, "backward_seconds": 0.0006, "recompute_seconds": 0.0003},
    {"param_bytes": "3227648", "input_bytes": "262144", "saved_bytes": "4194304",
     "forward_transient_bytes": "1048576", "backward_transient_bytes": "2097152",
     "forward_seconds": 0.0003, "backward_seconds": 0.0006, "recompute_seconds": 0.0003},
    {"param_bytes": "3227648", "input_bytes": "262144", "saved_bytes": "4194304",
     "forward_transient_bytes": "1048576", "backward_transient_bytes": "2097152",
     "forward_seconds": 0.0003, "backward_seconds": 0.0006, "recompute_seconds": 0.0003},
    {"param_bytes": "3227648", "input_bytes": "262144", "saved_bytes": "4194304",
     "forward_transient_bytes": "1048576", "backward_transient_bytes": "2097152",
     "forward_seconds": 0.0003, "backward_seconds": 0.0006, "recompute_seconds": 0.0003}],
  "head": {"param_bytes": "1049088", "saved_bytes": "4194304", "forward_transient_bytes": "4194304",
           "backward_transient_bytes": "4194304", "forward_seconds": 0.0002,
           "backward_seconds": 0.0004},
  "trainable_param_count": "7000000",
  "total_param_count": "7000000"
})";

// The first whitespace-delimited word after `prefix` in `text` ("" when absent).
std::string WordAfter(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return "";
  const size_t start = at + prefix.size();
  const size_t end = text.find_first_of(" \n", start);
  return text.substr(start, end - start);
}

TEST_F(MemplanCliE2eTest, TraceSubmitGetAndPlanFromIt) {
  const std::string path = absl::StrCat(::testing::TempDir(), "tiny_trace_", ::getpid(), ".json");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(kTinyTraceJson, f);
    std::fclose(f);
  }
  RunResult submit = Memplan({"trace", "submit", path});
  ::unlink(path.c_str());
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string trace_id = WordAfter(submit.out, "Stored trace ");
  ASSERT_FALSE(trace_id.empty()) << submit.out;

  RunResult get = Memplan({"trace", "get", trace_id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("profiled"));
  EXPECT_THAT(get.out, HasSubstr("block 3"));
  EXPECT_THAT(get.out, HasSubstr("1 × 512 tokens"));

  // No workload flags: the planner takes the trace's workload and says it used the trace.
  RunResult plan = Memplan({"plan", "--trace-id", trace_id, "--gpu", "h100-80gb", "--skip-limits"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr(absl::StrCat("profiled (", trace_id, ")")));
  // A different sequence length cannot be planned from this trace.
  RunResult other = Memplan(
      {"plan", "--trace-id", trace_id, "--gpu", "h100-80gb", "--batch", "1", "--seq", "1024"});
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_THAT(other.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(other.err, HasSubstr("seq_len"));
}

TEST_F(MemplanCliE2eTest, HardwareSubmitGetAndPlanWithIt) {
  // Start from the published rtx-4090 figures, as an agent would after measuring its card.
  RunResult presets = Memplan({"--json", "hardware", "list"});
  ASSERT_EQ(presets.exit_code, 0) << presets.err;
  const size_t at = presets.out.find("\"name\": \"rtx-4090\"");
  ASSERT_NE(at, std::string::npos) << presets.out;
  const size_t open = presets.out.rfind('{', at);
  const size_t close = presets.out.find('}', at);
  std::string profile = presets.out.substr(open, close - open + 1);
  profile.replace(profile.find("\"rtx-4090\""), 10, "\"rtx-4090-lab\"");
  const std::string path = absl::StrCat(::testing::TempDir(), "profile_", ::getpid(), ".json");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(profile.c_str(), f);
    std::fclose(f);
  }
  RunResult submit = Memplan({"hardware", "submit", path});
  ::unlink(path.c_str());
  ASSERT_EQ(submit.exit_code, 0) << submit.err << "\nprofile: " << profile;
  const std::string profile_id = WordAfter(submit.out, "Stored hardware profile ");
  ASSERT_FALSE(profile_id.empty()) << submit.out;

  RunResult get = Memplan({"hardware", "get", profile_id});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("rtx-4090-lab"));
  EXPECT_THAT(get.out, HasSubstr("23.99 GiB"));  // the preset's 24564 MiB

  RunResult plan =
      Memplan({"plan", "--arch", "llama-tiny", "--hardware-id", profile_id, "--skip-limits"});
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_THAT(plan.out, HasSubstr("FITS"));
  RunResult missing = Memplan({"hardware", "get", "hw-does-not-exist"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("NOT_FOUND"));
}

TEST(MemplanCliUnreachableTest, ExplainsAndExitsOne) {
  RunResult r = RunProgram(MEMPLAN_CLI_BIN, {"--planner", "127.0.0.1:1", "presets"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the planner at 127.0.0.1:1"));
}

// `text` without the lines that differ between two answers to one request: the plan id and the
// search's timing ("Plan id", "Search" in the table; "plan_id", "search_seconds" in JSON).
std::string WithoutIdsAndTimes(const std::string& text) {
  std::string kept;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, "Plan id ") || absl::StartsWith(line, "Search ") ||
        absl::StrContains(line, "\"plan_id\":") || absl::StrContains(line, "\"search_seconds\":")) {
      continue;
    }
    absl::StrAppend(&kept, line, "\n");
  }
  return kept;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// `memplan plan` without --planner answers in-process with the daemon's engine: the same answer a
// daemon gives on a fresh database, with no daemon running, and no database created or changed.
TEST(MemplanInProcessTest, PlanWithoutPlannerMatchesTheDaemon) {
  std::string dir = ::testing::TempDir() + "/memplan-inproc-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string db = dir + "/planner.db";
  const std::vector<std::string> request = {"plan", "--arch", "llama-3.1-8b", "--gpu",
                                            "h100-80gb"};
  const auto with = [&](std::vector<std::string> front) {
    front.insert(front.end(), request.begin(), request.end());
    return front;
  };

  std::string daemon_text, daemon_json;
  {
    auto daemon = memplan::testing::DaemonProcess::Start(MEMPLAN_PLANNER_BIN, db,
                                                         dir + "/planner.log", false);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    RunResult text = RunProgram(MEMPLAN_CLI_BIN, with({"--planner", daemon->address()}));
    ASSERT_EQ(text.exit_code, 0) << text.err;
    RunResult json = RunProgram(MEMPLAN_CLI_BIN, with({"--planner", daemon->address(), "--json"}));
    ASSERT_EQ(json.exit_code, 0) << json.err;
    daemon_text = text.out;
    daemon_json = json.out;
    auto status = daemon->SignalAndWait(SIGTERM);
    ASSERT_TRUE(status.ok()) << status.status();
  }
  EXPECT_THAT(daemon_text, HasSubstr("Verdict           FITS"));

  // No daemon now, and no --planner: in a folder without memplan-planner.db, a memory store.
  RunResult text = RunProgram(MEMPLAN_CLI_BIN, request, dir);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.err, HasSubstr("answered in-process"));
  EXPECT_THAT(text.out, HasSubstr("Plan id           plan-"));
  EXPECT_EQ(WithoutIdsAndTimes(text.out), WithoutIdsAndTimes(daemon_text));
  RunResult json = RunProgram(MEMPLAN_CLI_BIN, with({"--json"}), dir);
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"plan_id\": \"plan-"));
  EXPECT_EQ(WithoutIdsAndTimes(json.out), WithoutIdsAndTimes(daemon_json));
  EXPECT_FALSE(Exists(dir + "/memplan-planner.db"));

  // Reading the daemon's database (read only: its bytes stay as the daemon left them).
  const auto file_bytes = [](const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    std::string bytes;
    if (f == nullptr) return bytes;
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.append(buffer, n);
    std::fclose(f);
    return bytes;
  };
  const std::string before = file_bytes(db);
  ASSERT_FALSE(before.empty());
  RunResult from_db = RunProgram(MEMPLAN_CLI_BIN, with({"--db", db, "--json"}));
  ASSERT_EQ(from_db.exit_code, 0) << from_db.err;
  EXPECT_THAT(from_db.err, HasSubstr("calibration from " + db));
  EXPECT_EQ(WithoutIdsAndTimes(from_db.out), WithoutIdsAndTimes(daemon_json));
  EXPECT_EQ(file_bytes(db), before);

  RunResult missing = RunProgram(MEMPLAN_CLI_BIN, with({"--db", dir + "/none.db"}));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err, HasSubstr("--db: " + dir + "/none.db does not exist"));
  EXPECT_FALSE(Exists(dir + "/none.db"));
}

// The commands that need stored state still go to a daemon, and say why when there is none.
TEST(MemplanInProcessTest, MeasureStillNeedsAPlanner) {
  RunResult r = RunProgram(MEMPLAN_CLI_BIN, {"--timeout", "2", "plans", "list"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach the planner at 127.0.0.1:50051"));
  EXPECT_THAT(r.err, HasSubstr("needs a running planner"));
  RunResult db = RunProgram(MEMPLAN_CLI_BIN, {"--db", "x.db", "plans", "list"});
  EXPECT_EQ(db.exit_code, 2);
  EXPECT_THAT(db.err, HasSubstr("--db: is read by in-process answers only"));
}

// A folder under the test's temp dir, removed with what it holds (files only) when it goes.
class TempFolder {
 public:
  explicit TempFolder(absl::string_view name)
      : path_(absl::StrCat(::testing::TempDir(), name, "_", ::getpid())) {
    ::mkdir(path_.c_str(), 0700);
  }
  ~TempFolder() {
    for (const std::string& file : files_) ::unlink(file.c_str());
    ::rmdir(path_.c_str());
  }
  // Writes `text` to `name` inside the folder (executable when asked).
  std::string Write(absl::string_view name, absl::string_view text, bool executable = false) {
    const std::string file = absl::StrCat(path_, "/", name);
    FILE* f = std::fopen(file.c_str(), "w");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    ::chmod(file.c_str(), executable ? 0700 : 0600);
    files_.push_back(file);
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

TEST(MemplanEnvTest, ReportsEverySectionAndNoGpuWithoutNvidiaSmi) {
  TempFolder cwd("memplan_env_plain");
  // A PATH with neither nvidia-smi nor memplan-agent (the build puts the agent elsewhere).
  RunResult r = RunProgram(MEMPLAN_CLI_BIN, {"env"}, cwd.path(), "/usr/bin:/bin");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const RunResult version = RunProgram(MEMPLAN_CLI_BIN, {"--version"});
  ASSERT_EQ(version.exit_code, 0);
  EXPECT_EQ(r.out.substr(0, r.out.find('\n') + 1), version.out);
  for (const char* section : {"\nMemplan\n", "\nLibraries\n", "\nHost\n", "\nGPUs\n",
                              "\nAgent\n", "\nPlanner\n"}) {
    EXPECT_THAT(r.out, HasSubstr(section));
  }
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*  grpc: +[0-9]+\\.[0-9]+(.|\n)*"));
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*  protobuf: +[0-9]+\\.[0-9]+\\.[0-9]+\n(.|\n)*"));
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*  sqlite: +3\\.[0-9]+(.|\n)*"));
  EXPECT_THAT(r.out, MatchesRegex("(.|\n)*  ram: +[0-9]+\\.[0-9] GiB\n(.|\n)*"));
  EXPECT_THAT(r.out, HasSubstr("status:  no NVIDIA GPU found (nvidia-smi not on PATH)"));
  EXPECT_THAT(r.out, HasSubstr("memplan-agent not found"));
  EXPECT_THAT(r.out, HasSubstr("./memplan-planner.db does not exist"));
  EXPECT_THAT(r.out, HasSubstr("not contacted (no --planner)"));
  EXPECT_EQ(r.err, "");

  RunResult help = RunProgram(MEMPLAN_CLI_BIN, {"env", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("Usage: memplan env"));
  EXPECT_EQ(RunProgram(MEMPLAN_CLI_BIN, {"env", "extra"}).exit_code, 2);
}

TEST_F(MemplanCliE2eTest, EnvWithGpusAnAgentAndThePlanner) {
  // Stand-ins that print what the real tools print on a GPU host.
  TempFolder tools("memplan_env_tools");
  tools.Write("nvidia-smi",
              "#!/bin/sh\n"
              "printf 'NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15\\n"
              "NVIDIA GeForce RTX 4090, 24564 MiB, 550.54.15\\n'\n",
              /*executable=*/true);
  tools.Write("memplan-agent",
              "#!/bin/sh\n"
              "[ \"$1\" = --version ] || exit 2\n"
              "printf 'memplan-agent 0.1.0 (git abc, Release)\\ntorch 2.11.0\\n"
              "cuda_runtime 13.0\\ncudnn 9.19.0\\nnccl 2.28.9\\n'\n",
              /*executable=*/true);
  tools.Write("memplan-planner.db", "");
  RunResult r = RunProgram(MEMPLAN_CLI_BIN, {"--json", "--planner", *address_, "env"},
                           tools.path(), absl::StrCat(tools.path(), ":/usr/bin:/bin"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"version_line\": \"memplan "));
  EXPECT_THAT(r.out, HasSubstr("\"name\": \"NVIDIA H100 80GB HBM3\""));
  EXPECT_THAT(r.out, HasSubstr("\"driver\": \"550.54.15\""));
  EXPECT_THAT(r.out, HasSubstr("\"preset\": \"h100-80gb (by model h100 and memory)\""));
  EXPECT_THAT(r.out, HasSubstr("\"preset\": \"rtx-4090 (by name)\""));
  EXPECT_THAT(r.out, HasSubstr("\"torch\": \"2.11.0\""));
  EXPECT_THAT(r.out, HasSubstr("\"nccl\": \"2.28.9\""));
  EXPECT_THAT(r.out, HasSubstr("\"version\": \"0.1.0 (git abc, Release)\""));
  EXPECT_THAT(r.out, HasSubstr("./memplan-planner.db (0 bytes"));
  EXPECT_THAT(r.out, MatchesRegex(absl::StrCat("(.|\n)*\"daemon\": \"", *address_,
                                               ": answered ListPresets: [0-9]+ model and [0-9]+ "
                                               "hardware presets\"(.|\n)*")));
}

TEST(MemplanVersionTest, EveryBinaryPrintsItsVersion) {
  for (const std::string& binary : {std::string(MEMPLAN_CLI_BIN), std::string(MEMPLAN_PLANNER_BIN)}) {
    RunResult r = RunProgram(binary, {"--version"});
    EXPECT_EQ(r.exit_code, 0) << binary << ": " << r.err;
    EXPECT_THAT(r.out, MatchesRegex("memplan(-planner)? [0-9]+\\.[0-9]+\\.[0-9]+ \\(git [^,]+, "
                                    "[A-Za-z]+\\)\n")) << binary;
  }
}

}  // namespace
