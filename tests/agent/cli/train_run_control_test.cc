// `memplan-agent train` as an operator sees it: step lines with the total and an ETA, every save
// logged before and after (bytes, seconds), a resume that has nothing left to do said plainly,
// SIGTERM/SIGINT ending the run after the step in flight with a checkpoint, the learning-rate
// schedule and held-out evaluation in the log, weights checked before the model is built, LoRA
// resumes that take their adapter settings from the checkpoint, and exports that carry the source
// model's tokenizer.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
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
using ::testing::Not;

struct Exit {
  int code = -1;
  std::string out;  // stderr, then stdout
};

Exit Wait(const testing::Child& child) {
  int status = 0;
  EXPECT_EQ(waitpid(child.pid, &status, 0), child.pid);
  Exit e;
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  e.out = testing::ReadFile(child.err_path) + testing::ReadFile(child.out_path);
  std::remove(child.out_path.c_str());
  std::remove(child.err_path.c_str());
  return e;
}

Exit RunChild(const std::vector<std::string>& args, const std::string& base) {
  return Wait(testing::Spawn(args, {}, base));
}

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The log lines whose msg is `msg`, each as its key=value fields (quotes kept off).
std::vector<std::map<std::string, std::string>> Records(const std::string& log,
                                                        const std::string& msg) {
  std::vector<std::map<std::string, std::string>> out;
  const std::string marker = "msg=\"" + msg + "\"";
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.find(marker) == absl::string_view::npos) continue;
    std::map<std::string, std::string> fields;
    for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      const size_t eq = field.find('=');
      if (eq == absl::string_view::npos) continue;
      std::string value(field.substr(eq + 1));
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
        value = value.substr(1, value.size() - 2);
      }
      fields[std::string(field.substr(0, eq))] = value;
    }
    out.push_back(std::move(fields));
  }
  return out;
}

double Number(const std::map<std::string, std::string>& fields, const std::string& key) {
  double v = std::nan("");
  auto it = fields.find(key);
  if (it == fields.end() || !absl::SimpleAtod(it->second, &v)) {
    ADD_FAILURE() << "no number " << key;
  }
  return v;
}

class TrainRunControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = absl::StrCat(::testing::TempDir(), "/train_run_control_", getpid());
    std::filesystem::create_directories(base_);
    data_ = base_ + "/train.tokens";
    const Exit made = RunChild({MEMPLAN_MAKE_TOKENS_BINARY, "--out=" + data_, "--tokens=8192",
                                "--vocab=2048", "--seed=3"},
                               base_ + "/make");
    ASSERT_EQ(made.code, 0) << made.out;
  }
  // This binary does not link Torch, so std::filesystem is safe here.
  void TearDown() override { std::filesystem::remove_all(base_); }

  // llama-tiny (vocab 2048) on the CPU, unmanaged, small steps.
  std::vector<std::string> Train(int64_t steps) const {
    return {MEMPLAN_AGENT_BINARY, "train",   "--arch",  "llama-tiny", "--device",
            "cpu",                "--data",  data_,     "--batch",    "2",
            "--seq",              "32",      "--steps", std::to_string(steps),
            "--cpu-threads",      "1"};
  }
  std::string Path(const std::string& name) const { return base_ + "/" + name; }
  std::string WriteFile(const std::string& name, const std::string& text) const {
    const std::string path = Path(name);
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::string base_, data_;
};

TEST_F(TrainRunControlTest, StepLinesCountTowardTheTotalAndSavesAreLogged) {
  const std::string save = Path("ckpt");
  const Exit e = RunChild(With(Train(3), {"--save", save, "--save-every", "2"}), Path("run"));
  ASSERT_EQ(e.code, 0) << e.out;
  const auto steps = Records(e.out, "step");
  ASSERT_EQ(steps.size(), 3u) << e.out;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(steps[i].at("step"), absl::StrCat(i + 1, "/3"));
    EXPECT_TRUE(steps[i].count("eta")) << e.out;
  }
  // The estimate is the mean step time times the steps left: none left after the last.
  EXPECT_GT(Number(steps[0], "eta_seconds"), 0);
  EXPECT_EQ(Number(steps[2], "eta_seconds"), 0);
  EXPECT_EQ(steps[2].at("eta"), "0s");

  // Step 2 (--save-every) and the end: each announced, then reported with its size and time.
  const auto saving = Records(e.out, "saving checkpoint");
  const auto saved = Records(e.out, "saved checkpoint");
  ASSERT_EQ(saving.size(), 2u) << e.out;
  ASSERT_EQ(saved.size(), 2u) << e.out;
  EXPECT_EQ(saving[0].at("step"), "2");
  EXPECT_EQ(saved[1].at("step"), "3");
  EXPECT_EQ(saved[1].at("dir"), save);
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(save)) {
    bytes += static_cast<int64_t>(entry.file_size());
  }
  EXPECT_EQ(Number(saved[1], "bytes"), static_cast<double>(bytes));
  EXPECT_GE(Number(saved[1], "seconds"), 0);
  EXPECT_LT(e.out.find("msg=\"saving checkpoint\" dir=\"" + save + "\" step=3"),
            e.out.find("msg=\"saved checkpoint\" dir=\"" + save + "\" step=3"));
}

TEST_F(TrainRunControlTest, ResumingACheckpointAlreadyAtStepsSaysNothingWasTrained) {
  const std::string save = Path("ckpt");
  ASSERT_EQ(RunChild(With(Train(3), {"--save", save}), Path("first")).code, 0);
  const std::string again = Path("again");
  const Exit e = RunChild(With(Train(2), {"--resume", save, "--save", again}), Path("second"));
  EXPECT_EQ(e.code, 0) << e.out;
  EXPECT_THAT(e.out, HasSubstr("nothing trained: --resume " + save +
                               " is already at step 3 >= --steps 2"));
  EXPECT_THAT(e.out, Not(HasSubstr("trained 3 steps")));
  EXPECT_THAT(e.out, Not(HasSubstr("msg=\"step\"")));
  EXPECT_THAT(e.out, Not(HasSubstr("model created")));
  EXPECT_FALSE(std::filesystem::exists(again));

  // Equal to --steps is also complete; one more continues from the checkpoint.
  EXPECT_THAT(RunChild(With(Train(3), {"--resume", save}), Path("third")).out,
              HasSubstr("nothing trained"));
  const Exit more = RunChild(With(Train(4), {"--resume", save}), Path("fourth"));
  EXPECT_EQ(more.code, 0) << more.out;
  const auto steps = Records(more.out, "step");
  ASSERT_EQ(steps.size(), 1u) << more.out;
  EXPECT_EQ(steps[0].at("step"), "4/4");
}

}  // namespace
}  // namespace memplan
