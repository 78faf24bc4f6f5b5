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


// A tiny Llama config.json (vocab 2048, like llama-tiny).
constexpr char kTinyConfig[] = R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 2048, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 256})";

// A safetensors file of one fp32 tensor `name` of one element.
std::string OneTensorSafetensors(const std::string& name) {
  const std::string header =
      absl::StrCat(R"({")", name, R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})");
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + std::string(4, '\0');
}

TEST_F(TrainRunControlTest, MissingWeightsAreReportedBeforeTheModelIsBuilt) {
  const std::vector<std::string> args = {MEMPLAN_AGENT_BINARY, "train", "--device", "cpu",
                                         "--synthetic-data", "--steps", "1", "--seq", "16",
                                         "--cpu-threads", "1", "--model"};
  // A config and nothing else.
  WriteFile("bare/config.json", kTinyConfig);
  Exit e = RunChild(With(args, {Path("bare")}), Path("bare_run"));
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--model " + Path("bare") + " has no model weights"));
  EXPECT_THAT(e.out, HasSubstr("no weight files at all"));
  EXPECT_THAT(e.out, Not(HasSubstr("model created")));

  // Weights in a format memplan does not read are named.
  WriteFile("bin/config.json", kTinyConfig);
  WriteFile("bin/pytorch_model.bin", "not read");
  e = RunChild(With(args, {Path("bin")}), Path("bin_run"));
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr("only pytorch_model.bin: memplan reads safetensors"));
  EXPECT_THAT(e.out, Not(HasSubstr("model created")));

  // An index whose shards are partly absent: every missing one is listed.
  WriteFile("shards/config.json", kTinyConfig);
  WriteFile("shards/model-00001-of-00003.safetensors", OneTensorSafetensors("a"));
  WriteFile("shards/model.safetensors.index.json", R"({"weight_map": {
      "a": "model-00001-of-00003.safetensors", "b": "model-00002-of-00003.safetensors",
      "c": "model-00003-of-00003.safetensors"}})");
  e = RunChild(With(args, {Path("shards")}), Path("shards_run"));
  EXPECT_EQ(e.code, 1) << e.out;
  EXPECT_THAT(e.out, HasSubstr(Path("shards") +
                               ": model.safetensors.index.json names 3 weight files, 2 of them "
                               "missing: model-00002-of-00003.safetensors, "
                               "model-00003-of-00003.safetensors"));
  EXPECT_THAT(e.out, Not(HasSubstr("model created")));
}

// Starts a long run, waits for its first step line, sends `signo` and waits for the exit.
Exit StopMidRun(const std::vector<std::string>& args, const std::string& base, int signo) {
  const testing::Child child = testing::Spawn(args, {}, base);
  EXPECT_GT(child.pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (testing::ReadFile(child.err_path).find("msg=\"step\"") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(child.pid, signo);
  return Wait(child);
}

int64_t StoppedAfterStep(const std::string& out, const std::string& signal) {
  const std::string marker = "stopped by " + signal + " after step ";
  const size_t at = out.find(marker);
  if (at == std::string::npos) return -1;
  int64_t step = -1;
  const std::string rest = out.substr(at + marker.size());
  if (!absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &step)) return -1;
  return step;
}

TEST_F(TrainRunControlTest, SigtermFinishesTheStepSavesACheckpointAndTheRunResumes) {
  const std::string save = Path("ckpt");
  const Exit stopped = StopMidRun(With(Train(1000000), {"--save", save}), Path("long"), SIGTERM);
  EXPECT_EQ(stopped.code, 3) << stopped.out;
  const int64_t step = StoppedAfterStep(stopped.out, "SIGTERM");
  ASSERT_GE(step, 1) << stopped.out;
  EXPECT_THAT(stopped.out, HasSubstr(absl::StrCat("after step ", step, " of 1000000: checkpoint of step ",
                                                  step, " in ", save, " (continue with --resume ",
                                                  save, ")")));
  EXPECT_THAT(stopped.out, HasSubstr("msg=\"stopped by signal\" signal=\"SIGTERM\""));
  EXPECT_THAT(stopped.out, Not(HasSubstr("trained ")));
  // The checkpoint holds the last whole step.
  EXPECT_THAT(testing::ReadFile(save + "/trainer.json"), HasSubstr(absl::StrCat("\"step\": ", step, ",")));

  const Exit resumed = RunChild(With(Train(step + 1), {"--resume", save}), Path("resumed"));
  EXPECT_EQ(resumed.code, 0) << resumed.out;
  const auto steps = Records(resumed.out, "step");
  ASSERT_EQ(steps.size(), 1u) << resumed.out;
  EXPECT_EQ(steps[0].at("step"), absl::StrCat(step + 1, "/", step + 1));
  EXPECT_THAT(resumed.out, HasSubstr(absl::StrCat("trained ", step + 1, " steps")));
}

TEST_F(TrainRunControlTest, SigintWithoutSaveSaysNothingWasSaved) {
  const Exit stopped = StopMidRun(Train(1000000), Path("long"), SIGINT);
  EXPECT_EQ(stopped.code, 3) << stopped.out;
  EXPECT_GE(StoppedAfterStep(stopped.out, "SIGINT"), 1) << stopped.out;
  EXPECT_THAT(stopped.out, HasSubstr("nothing saved (no --save)"));
}

TEST_F(TrainRunControlTest, TheCosineScheduleIsLoggedAndContinuesAfterAResume) {
  const std::vector<std::string> schedule = {"--lr", "1e-3", "--lr-schedule", "cosine",
                                             "--warmup-steps", "2", "--min-lr-ratio", "0.1"};
  const Exit straight = RunChild(With(Train(6), schedule), Path("straight"));
  ASSERT_EQ(straight.code, 0) << straight.out;
  const auto steps = Records(straight.out, "step");
  ASSERT_EQ(steps.size(), 6u);
  // transformers' cosine-with-min-lr lambda at the scheduler's count (step - 1), times --lr.
  const double pi = 3.14159265358979323846;
  const double expected[6] = {0, 0.5e-3, 1e-3,
                              1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(pi * 0.25))),
                              1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(pi * 0.5))),
                              1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(pi * 0.75)))};
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(Number(steps[i], "lr"), expected[i], 1e-9) << i;
  }
  // Stopped at step 3 and resumed: the rates of steps 4-6 are the straight run's.
  const std::string save = Path("ckpt");
  ASSERT_EQ(RunChild(With(With(Train(6), schedule), {"--save", save, "--save-every", "3",
                                                     "--steps", "3"}),
                     Path("first"))
                .code,
            0);
  const Exit resumed = RunChild(With(With(Train(6), schedule), {"--resume", save}), Path("second"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  const auto later = Records(resumed.out, "step");
  ASSERT_EQ(later.size(), 3u) << resumed.out;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(later[i].at("lr"), steps[3 + i].at("lr"));
    EXPECT_EQ(later[i].at("loss"), steps[3 + i].at("loss"));
  }
}

TEST_F(TrainRunControlTest, TheEvalLossIsTheForwardLossOfTheSameBatches) {
  // With --lr 0 nothing moves, so step k's loss is the forward loss of micro-batch k - 1 under the
  // initial weights; with the training file as --eval-tokens the evaluation batches are those.
  for (const std::vector<std::string>& plan :
       {std::vector<std::string>{}, std::vector<std::string>{"--chunk-mib", "1", "--n-persist", "1"}}) {
    const Exit e = RunChild(With(With(Train(3), plan), {"--lr", "0", "--eval-tokens", data_,
                                                        "--eval-every", "2", "--eval-batches", "2"}),
                            Path("eval"));
    ASSERT_EQ(e.code, 0) << e.out;
    const auto steps = Records(e.out, "step");
    const auto evals = Records(e.out, "eval loss");
    ASSERT_EQ(steps.size(), 3u) << e.out;
    // Every 2 steps and after the last.
    ASSERT_EQ(evals.size(), 2u) << e.out;
    EXPECT_EQ(evals[0].at("step"), "2");
    EXPECT_EQ(evals[1].at("step"), "3");
    const double mean = (Number(steps[0], "loss") + Number(steps[1], "loss")) / 2;
    for (const auto& eval : evals) {
      EXPECT_NEAR(Number(eval, "loss"), mean, 2e-5) << e.out;
      EXPECT_EQ(eval.at("batches"), "2");
      EXPECT_EQ(eval.at("tokens"), "128");
    }
  }
}


std::vector<std::string> LoraFlags() {
  return {"--lr", "1e-2", "--lora-rank", "4", "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj"};
}

TEST_F(TrainRunControlTest, ALoraResumeTakesItsSettingsFromTheCheckpoint) {
  const Exit straight = RunChild(With(Train(3), LoraFlags()), Path("straight"));
  ASSERT_EQ(straight.code, 0) << straight.out;
  const std::string save = Path("lora_ckpt");
  ASSERT_EQ(RunChild(With(With(Train(2), LoraFlags()), {"--save", save}), Path("first")).code, 0);

  // No LoRA flag: rank, alpha and targets come from adapter_config.json; the run continues as
  // the straight one.
  const Exit resumed =
      RunChild(With(Train(3), {"--lr", "1e-2", "--resume", save}), Path("resumed"));
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  const auto adopted = Records(resumed.out, "LoRA settings from the checkpoint");
  ASSERT_EQ(adopted.size(), 1u) << resumed.out;
  EXPECT_EQ(adopted[0].at("rank"), "4");
  EXPECT_EQ(adopted[0].at("alpha"), "8");
  EXPECT_EQ(adopted[0].at("targets"), "q_proj,v_proj");
  const auto steps = Records(resumed.out, "step");
  ASSERT_EQ(steps.size(), 1u) << resumed.out;
  EXPECT_EQ(steps[0].at("loss"), Records(straight.out, "step")[2].at("loss"));

  // The same settings given again are accepted; contradicting ones name both values.
  EXPECT_EQ(RunChild(With(With(Train(3), LoraFlags()), {"--resume", save}), Path("same")).code, 0);
  const std::string config = save + "/adapter_config.json";
  Exit e = RunChild(With(Train(3), {"--resume", save, "--lora-rank", "8"}), Path("rank"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--lora-rank 8 contradicts r = 4 in " + config));
  e = RunChild(With(Train(3), {"--resume", save, "--lora-targets", "q_proj"}), Path("targets"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_THAT(e.out,
              HasSubstr("--lora-targets q_proj contradicts target_modules = q_proj,v_proj in " +
                        config));
  e = RunChild(With(Train(3), {"--resume", save, "--lora-alpha", "16"}), Path("alpha"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--lora-alpha 16 contradicts lora_alpha = 8 in " + config));
  // A full checkpoint gives nothing: LoRA-only flags still need a rank.
  const std::string full = Path("full");
  ASSERT_EQ(RunChild(With(Train(1), {"--save", full}), Path("full_run")).code, 0);
  e = RunChild(With(Train(2), {"--resume", full, "--lora-targets", "q_proj"}), Path("no_rank"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_THAT(e.out, HasSubstr("--lora-targets: needs --lora-rank"));
}

TEST_F(TrainRunControlTest, ExportsCarryTheTokenizerAndNoEmptyOptimizerFile) {
  // A Hugging Face model directory: a one-step checkpoint plus tokenizer and generation files.
  const std::string model = Path("model");
  ASSERT_EQ(RunChild(With(Train(1), {"--save", model}), Path("make_model")).code, 0);
  const std::map<std::string, std::string> side = {
      {"tokenizer.json", R"({"version": "1.0", "model": {"type": "BPE"}})"},
      {"tokenizer_config.json", R"({"model_max_length": 256})"},
      {"special_tokens_map.json", R"({"eos_token": "</s>"})"},
      {"generation_config.json", R"({"do_sample": true, "temperature": 0.6})"}};
  for (const auto& [name, text] : side) WriteFile("model/" + name, text);
  auto expect_side_files = [&side](const std::string& dir) {
    for (const auto& [name, text] : side) {
      EXPECT_EQ(testing::ReadFile(dir + "/" + name), text) << dir << "/" << name;
    }
  };
  const std::vector<std::string> from_model = {
      MEMPLAN_AGENT_BINARY, "train", "--model", model, "--device", "cpu", "--data", data_,
      "--batch", "2", "--seq", "32", "--steps", "1", "--cpu-threads", "1"};

  // Full fine-tune: the checkpoint, then `memplan-agent export` of it.
  const std::string ckpt = Path("ckpt");
  Exit e = RunChild(With(from_model, {"--save", ckpt}), Path("full"));
  ASSERT_EQ(e.code, 0) << e.out;
  expect_side_files(ckpt);
  const std::string exported = Path("exported");
  e = RunChild({MEMPLAN_AGENT_BINARY, "export", ckpt, exported}, Path("export"));
  ASSERT_EQ(e.code, 0) << e.out;
  expect_side_files(exported);
  EXPECT_TRUE(std::filesystem::exists(exported + "/optimizer.safetensors"));
  const std::string params_only = Path("params_only");
  e = RunChild({MEMPLAN_AGENT_BINARY, "export", ckpt, params_only, "--params-only"},
               Path("export2"));
  ASSERT_EQ(e.code, 0) << e.out;
  expect_side_files(params_only);
  EXPECT_FALSE(std::filesystem::exists(params_only + "/optimizer.safetensors"));
  // A checkpoint without optimizer state resumes (the optimizer starts afresh).
  e = RunChild({MEMPLAN_AGENT_BINARY, "train", "--arch", "llama-tiny", "--device", "cpu", "--data",
                data_, "--batch", "2", "--seq", "32", "--steps", "2", "--cpu-threads", "1",
                "--resume", params_only},
               Path("resume_params_only"));
  EXPECT_EQ(e.code, 0) << e.out;

  // LoRA: the adapter and the merged model carry them; the merged model has no optimizer file
  // and loads as a --model.
  const std::string adapter = Path("adapter");
  const std::string merged = Path("merged");
  e = RunChild(With(from_model, {"--lora-rank", "4", "--lora-targets", "q_proj", "--save-adapter",
                                 adapter, "--merge-export", merged}),
               Path("lora"));
  ASSERT_EQ(e.code, 0) << e.out;
  expect_side_files(adapter);
  expect_side_files(merged);
  EXPECT_FALSE(std::filesystem::exists(merged + "/optimizer.safetensors"));
  std::vector<std::string> again = from_model;
  again[3] = merged;
  e = RunChild(again, Path("from_merged"));
  EXPECT_EQ(e.code, 0) << e.out;
}

// --kernel-trace writes one step's Kineto trace (CPU operators on a CPU run) as Chrome-trace JSON,
// says which step it was, and refuses a step that never runs.
TEST_F(TrainRunControlTest, AKernelTraceRecordsTheChosenStepAsChromeJson) {
  const std::string trace = Path("step2.json");
  const Exit e =
      RunChild(With(Train(3), {"--kernel-trace", trace, "--kernel-trace-step", "2"}), Path("kt"));
  ASSERT_EQ(e.code, 0) << e.out;
  const auto written = Records(e.out, "kernel trace written");
  ASSERT_EQ(written.size(), 1u) << e.out;
  EXPECT_EQ(written[0].at("step"), "2");
  EXPECT_EQ(written[0].at("file"), trace);
  const std::string json = testing::ReadFile(trace);
  EXPECT_THAT(json, HasSubstr("\"traceEvents\""));
  EXPECT_THAT(json, HasSubstr("\"cat\": \"cpu_op\""));
  EXPECT_THAT(json, HasSubstr("aten::mm"));  // the step's projections ran inside the trace

  const Exit late =
      RunChild(With(Train(3), {"--kernel-trace", trace, "--kernel-trace-step", "4"}), Path("kt4"));
  EXPECT_NE(late.code, 0);
  EXPECT_THAT(late.out, HasSubstr("--kernel-trace-step: 4 is past --steps 3"));
  const Exit alone = RunChild(With(Train(3), {"--kernel-trace-step", "2"}), Path("kt5"));
  EXPECT_NE(alone.code, 0);
  EXPECT_THAT(alone.out, HasSubstr("needs --kernel-trace FILE"));
}

}  // namespace
}  // namespace memplan
